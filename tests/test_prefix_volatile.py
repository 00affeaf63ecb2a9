"""The doctor names volatile head content the first time it changes, and an edit stays an edit."""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.tiering.prefix.causes import classify
from kvtier.tiering.prefix.doctor import PrefixDoctor
from kvtier.tiering.prefix.volatile import changes, looks_random, spans

RULES = "You are a careful coding agent. Follow the repository's rules."


def _req(system: str, *, tools=None, extra: int = 0) -> dict:
    msgs = [{"role": "system", "content": system},
            {"role": "user", "content": "Fix the failing test in parser.py"}]
    msgs += [{"role": "assistant", "content": f"step {i}"} for i in range(extra)]
    return {"messages": msgs, **({"tools": tools} if tools is not None else {})}


def _second_turn(head0: str, head1: str, **kw):
    """A trajectory's first two turns, the head changed from ``head0`` to ``head1``; the second
    turn's report (the first sighting of the change)."""
    d = PrefixDoctor(block_tokens=16)
    d.observe("t", _req(head0, **kw))
    return d.observe("t", _req(head1, extra=1, **kw))


# (kind, value in turn 0, value in turn 1): each written into the system prompt
VOLATILE = [
    ("date and time", "2026-12-07T13:13:01Z", "2026-12-07T13:14:02Z"),
    ("date", "2026-12-07", "2026-12-08"),
    ("date", "12/07/2026", "12/08/2026"),
    ("date", "December 7, 2026", "December 8, 2026"),
    ("date", "7th Dec 2026", "8th Dec 2026"),
    ("clock time", "13:13", "13:14"),
    ("clock time", "1:13 PM", "1:14 PM"),
    ("weekday", "Monday", "Tuesday"),
    ("UUID", "3f2b6c1e-8a4d-4c2e-9b7a-1d2e3f4a5b6c", "9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b"),
    ("request id", "req_8f3KQ2xZ", "req_b71LmP0q"),
    ("request id", "call_Ab12Cd34Ef", "call_Zx98Yw76Vu"),
    ("epoch number", "1765113181", "1765113242"),
    ("hex id", "9f86d081884c7d65", "1b4f0e9851971998"),
    ("hex id", "3f9a2b1c", "9e01d4f7"),
    ("nonce", "Xk3j9QpL2m", "Tz8Qw1Rb7n"),
    ("nonce", "dGhpcyBpcyBh", "bm9uY2UgMTIz"),
]


@pytest.mark.parametrize("kind,a,b", VOLATILE, ids=[f"{k}:{a}" for k, a, _ in VOLATILE])
def test_a_volatile_value_in_the_head_is_named_on_its_first_change(kind, a, b):
    head0, head1 = f"Session {a}. {RULES}", f"Session {b}. {RULES}"
    t = _second_turn(head0, head1)
    assert t.cause == "head_volatile"
    (v,) = t.volatile
    assert (v.kind, v.field, v.before, v.after) == (kind, "messages[0].content", a, b)
    assert head1[v.start:v.end] == b and v.start == len("Session ")
    assert t.note == f"{kind} {a!r} -> {b!r} at messages[0].content chars {v.start}-{v.end}"


def test_a_request_id_after_its_key_is_named_and_only_the_value_is_marked():
    t = _second_turn(f"Request-ID: 48213. {RULES}", f"Request-ID: 90577. {RULES}")
    assert t.cause == "head_volatile"
    got = [(v.kind, v.before, v.after, v.start, v.end) for v in t.volatile]
    assert got == [("request id", "48213", "90577", 12, 17)]


def test_a_unix_date_line_names_each_part_that_changed():
    t = _second_turn(f"Started Mon Dec  7 13:13:01 UTC 2026. {RULES}", f"Started Tue Dec  8 09:02:11 UTC 2026. {RULES}")
    assert t.cause == "head_volatile"
    assert [v.kind for v in t.volatile] == ["weekday", "date", "clock time"]


# (what, turn 0, turn 1): real edits, some of them shaped like volatile values
EDITS = [
    ("an instruction", "Be careful with the tests.", "Be quick with the tests."),
    ("a renamed identifier", "Call getUserName2 first.", "Call getUserName3 first."),
    ("a product name", "Target the iPhone15Pro layout.", "Target the iPhone16Pro layout."),
    ("a version-like id", "Use schema v1_2_3_beta4.", "Use schema v1_2_3_beta5."),
    ("words that start like weekdays", "Monitor the logs.", "Sunlight the logs."),
    ("words after an id key", "Quote the message id for each reply.", "Quote the message id in each reply."),
    ("a file position", "The error is at parser.py:12:34 now.", "The error is at parser.py:15:10 now."),
    ("a version number", "Python 3.12.10 is installed.", "Python 3.12.11 is installed."),
    ("a count", "You have 5 tries left.", "You have 4 tries left."),
    ("a lowercase word of the nonce's length", "Mode: kqzpwlmx.", "Mode: bvtrnxqz."),
]


@pytest.mark.parametrize("what,a,b", EDITS, ids=[e[0] for e in EDITS])
def test_an_edit_stays_an_edit_even_when_it_looks_like_an_id(what, a, b):
    t = _second_turn(f"{RULES} {a}", f"{RULES} {b}")
    assert t.cause == "edit" and t.volatile == () and t.note == ""


def test_a_volatile_change_beside_a_real_edit_is_an_edit():
    # the same message: the clock moved and an instruction changed
    t = _second_turn(f"Now 13:13. {RULES}", f"Now 13:14. {RULES} Never push.")
    assert t.cause == "edit" and t.volatile == ()
    # another message: the clock moved in the system prompt, the user's task was rewritten
    d = PrefixDoctor()
    d.observe("t", _req(f"Now 13:13. {RULES}"))
    r = _req(f"Now 13:14. {RULES}", extra=1)
    r["messages"][1]["content"] = "Fix the failing test in lexer.py"
    assert d.observe("t", r).cause == "edit"
    # a nonce regenerated next to an identifier edited: the edit wins
    t = _second_turn(f"nonce=Xk3j9QpL2m call getUserName2. {RULES}", f"nonce=Tz8Qw1Rb7n call getUserName3. {RULES}")
    assert t.cause == "edit"


def test_every_change_of_a_volatile_head_is_named_again_and_the_extension_in_between_is_clean():
    # turn 0 -> 1: extends (none); 1 -> 2: the clock moves (first sighting); 2 -> 3: it moves again
    d = PrefixDoctor()
    causes = [d.observe("t", _req(f"Now {hh}. {RULES}", extra=i)).cause
              for i, hh in enumerate(["13:13", "13:13", "13:20", "14:02"])]
    assert causes == ["none", "none", "head_volatile", "head_volatile"]
    assert [v.after for v in d.trajectories["t"].turns[3].volatile] == ["14:02"]


def test_volatile_content_in_a_tool_definition_is_head_volatile_and_an_edited_tool_is_tools_changed():
    def tools(desc):
        return [{"type": "function", "function": {"name": "clock", "description": desc, "parameters": {}}}]
    t = _second_turn(RULES, RULES, tools=tools("Local time 13:13"))
    assert t.cause == "none"
    d = PrefixDoctor()
    d.observe("t", _req(RULES, tools=tools("Local time 13:13")))
    t = d.observe("t", _req(RULES, tools=tools("Local time 13:14"), extra=1))
    assert t.cause == "head_volatile"
    assert [(v.field, v.before, v.after) for v in t.volatile] == [("tools[0].function.description", "13:13", "13:14")]
    t = d.observe("t", _req(RULES, tools=tools("Local time, rounded: 13:14"), extra=2))
    assert t.cause == "tools_changed"


def test_volatile_arguments_inside_a_tool_call_are_found_in_the_parsed_arguments():
    def req(stamp):
        r = _req(RULES)
        r["messages"].append({"role": "assistant", "content": None, "tool_calls": [
            {"id": "c0", "type": "function", "function": {"name": "log", "arguments": json.dumps({"at": stamp})}}]})
        return r
    prev, cur = req("2026-12-07T13:13:01Z"), req("2026-12-07T13:13:05Z")
    cur["messages"].append({"role": "tool", "tool_call_id": "c0", "content": "ok"})
    c = classify(prev, cur, extends=False)
    assert c.name == "head_volatile"
    assert [v.field for v in c.volatile] == ["messages[2].tool_calls[0].function.arguments.at"]


def test_a_compaction_with_a_new_clock_is_still_a_compaction():
    d = PrefixDoctor()
    d.observe("t", _req(f"Now 13:13. {RULES}", extra=4))
    r = _req(f"Now 13:14. {RULES}")
    r["messages"].append({"role": "user", "content": "Summary of the work so far"})
    assert d.observe("t", r).cause == "compaction"


# --- token-only log lines: the differing span is decoded with the doctor's tokenizer

def _token_turns(doctor, texts, encode):
    return [doctor.observe("t", tokens=encode(x)).cause for x in texts]


def test_token_lines_are_decoded_to_tell_a_volatile_head_from_an_edit():
    enc = lambda s: list(s.encode())   # noqa: E731 - the byte tokenizer's ids
    d = PrefixDoctor()
    texts = [f"Now 13:13. {RULES}", f"Now 13:13. {RULES} ok", f"Now 13:20. {RULES} ok more",
             f"Now 13:20. {RULES} no more"]
    assert _token_turns(d, texts, enc) == ["none", "none", "head_volatile", "edit"]
    (v,) = d.trajectories["t"].turns[2].volatile
    assert (v.kind, v.field, v.start, v.end, v.before, v.after) == ("clock time", "tokens", 4, 9, "13:13", "13:20")
    # a volatile change and an edit in one token line: an edit
    d = PrefixDoctor()
    assert _token_turns(d, [f"Now 13:13. {RULES}", f"Now 13:14. Be quick. {RULES}"], enc) == ["none", "edit"]


def test_token_ids_the_tokenizer_cannot_decode_stay_an_edit():
    # ids past 255 are no bytes: the byte fallback cannot read them, so nothing is claimed
    d = PrefixDoctor()
    assert _token_turns(d, [[1000, 2000, 3000, 4000], [1000, 2001, 3000, 4000, 5000]], list) == ["none", "edit"]


def test_a_trained_tokenizer_decodes_token_lines(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from kvtier.tiering.prefix.render import FileTokenizer
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([RULES, "Now 13:13 on 2026-12-07", "Fix the failing test"] * 20, trainer=trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    ft = FileTokenizer(str(tmp_path))
    d = PrefixDoctor(ft)
    texts = [f"Session 2026-12-07T13:13:01Z. {RULES}", f"Session 2026-12-08T09:00:00Z. {RULES} Fix the failing test",
             f"Session 2026-12-08T09:00:00Z. {RULES} Fix a failing test"]
    assert _token_turns(d, texts, ft.encode) == ["none", "head_volatile", "edit"]
    assert [v.kind for v in d.trajectories["t"].turns[1].volatile] == ["date and time"]
    with pytest.raises(ValueError, match="vocabulary"):
        ft.decode([10 ** 6])


# --- the report carries what was seen

def test_the_json_report_lists_the_volatile_values(tmp_path, capsys):
    from kvtier.cli.main import main
    log = tmp_path / "log.jsonl"
    lines = [{"trajectory_id": "a", "request": _req(f"Now 13:13. {RULES}")},
             {"trajectory_id": "a", "request": _req(f"Now 13:14. {RULES}", extra=1)}]
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert main(["prefix", str(log), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    t0, t1 = doc["trajectories"]["a"]["turns"]
    assert t0["volatile"] == []
    assert t1["cause"] == "head_volatile"
    assert t1["volatile"] == [{"kind": "clock time", "field": "messages[0].content", "start": 4, "end": 9,
                               "before": "13:13", "after": "13:14"}]


def test_long_values_are_cut_in_the_report():
    a, b = "Q1w2E3r4" * 40, "Z9y8X7w6" * 40
    (v,) = changes(f"key {a} end", f"key {b} end", "f")
    assert v.kind == "nonce" and v.end - v.start == 320 and len(v.before) == len(v.after) == 80
    assert v.after.endswith("\u2026")


# --- the shapes themselves

def test_nonce_shape_tells_random_runs_from_identifiers():
    assert all(looks_random(s) for s in ["Xk3j9QpL2m", "dGhpcyBpcyBh", "9f86d081884c7d65", "k3j9qpl2",
                                         "sk-proj-AbC123xyzQ9"])
    assert not any(looks_random(s) for s in ["getUserName2", "sha256sum", "base64_encoded_value",
                                             "x86_64_linux_gnu", "/usr/local/bin/python3", "gpt-4o-mini",
                                             "claude-3-5-sonnet-20241022", "MAX_TOKENS_2048", "HTTPServer2",
                                             "kqzpwlmx", "20241022"])


def test_fixed_shapes_win_over_the_nonce_guess_and_do_not_overlap():
    text = "model gpt-4o-mini-2024-07-18 at 13:13:01.5 id 123e4567-e89b-12d3-a456-426614174000"
    got = [(s.kind, text[s.start:s.end], s.guessed) for s in spans(text)]
    assert got == [("date", "2024-07-18", False), ("clock time", "13:13:01.5", False),
                   ("UUID", "123e4567-e89b-12d3-a456-426614174000", False)]


_WORD = st.sampled_from(["alpha", "build", "check", "delta", "error", "file", "import", "line", "module",
                         "patch", "return", "test", "value", "Parser", "getName", "v2", "x86", "step3"])


@settings(max_examples=200, deadline=None)
@given(words=st.lists(_WORD, min_size=3, max_size=12), i=st.integers(min_value=0), new=_WORD)
def test_replacing_a_word_is_never_volatile(words, i, new):
    i %= len(words)
    edited = words[:i] + [new] + words[i + 1:]
    a, b = " ".join(words), " ".join(edited)
    assert changes(a, b, "f") == ([] if a == b else None)


@settings(max_examples=200, deadline=None)
@given(h0=st.integers(0, 23), m0=st.integers(0, 59), h1=st.integers(0, 23), m1=st.integers(0, 59),
       words=st.lists(_WORD, min_size=1, max_size=8))
def test_any_clock_time_change_is_volatile(h0, m0, h1, m1, words):
    tail = " ".join(words)
    a, b = f"Now {h0:02d}:{m0:02d}. {tail}", f"Now {h1:02d}:{m1:02d}. {tail}"
    kinds = [v.kind for v in changes(a, b, "f")]
    assert kinds == ([] if a == b else ["clock time"])
