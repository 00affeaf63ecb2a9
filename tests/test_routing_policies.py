"""The router's policies (tiering/routing/policies.py), the trajectory key, a request's cache_salt
in vLLM's block hashes, and ``kvtier route --policy``."""
from __future__ import annotations

import types

import pytest

from kvtier.tiering.prefix.score import Weights
from kvtier.tiering.routing.config import RouterConfig, parse_engine
from kvtier.tiering.routing.hashing import BlockHasher, external
from kvtier.tiering.routing.events import BlockStored
from kvtier.tiering.routing.policies import (POLICIES, Candidate, LeastLoaded, PrefixLoad, RoundRobin, Sticky,
                                             make_policy, trajectory_key)
from test_routing_proxy import A, B, CHAT, engines, joined, load_seen, pubs, router, tokens_of, until  # noqa: F401

C = "c:3"


def cands(*rows: tuple[str, float, float]) -> list[Candidate]:
    return [Candidate(n, saved, load) for n, saved, load in rows]


# ------------------------------------------------------------------------------ the policies
def test_prefix_load_follows_the_prefix_until_the_queue_outweighs_it():
    p = PrefixLoad(Weights(0.5, 1.0))
    # b holds 3/4 of the prompt, both idle: b
    assert p.pick(cands((A, 0, 0), (B, 96, 0)), 128, None).index == 1
    # b holds it but carries the whole load: 0.5*0.75 - 0.5*1 < 0.5*0 - 0.5*0.25 -> a
    assert p.pick(cands((A, 0, 1), (B, 96, 4)), 128, None).index == 0
    # equal scores and loads (an idle cluster, new sessions): in turn, not all to the first engine
    assert [p.pick(cands((A, 0, 0), (B, 0, 0)), 64, None).index for _ in range(4)] in ([0, 1, 0, 1], [1, 0, 1, 0])
    # a tie on score alone still goes to the lower load
    assert [p.pick(cands((A, 64, 2), (B, 0, 0)), 64, None).index for _ in range(2)] == [1, 1]


def test_round_robin_takes_the_candidates_in_turn_whatever_they_hold():
    p = RoundRobin()
    picks = [p.pick(cands((A, 128, 0), (B, 0, 9)), 128, "k").index for _ in range(4)]
    assert picks == [0, 1, 0, 1]
    # one engine out: the only candidate every time
    assert {p.pick(cands((B, 0, 0)), 128, "k").index for _ in range(3)} == {0}


def test_least_loaded_takes_the_smallest_load_and_rotates_ties():
    p = LeastLoaded()
    assert p.pick(cands((A, 128, 3), (B, 0, 1), (C, 0, 2)), 128, None).index == 1
    # an idle cluster is not all sent to the first engine
    assert [p.pick(cands((A, 0, 0), (B, 0, 0)), 64, None).index for _ in range(4)] in ([0, 1, 0, 1], [1, 0, 1, 0])
    s = p.pick(cands((A, 0, 2), (B, 0, 5)), 64, None).scores
    assert s == (-2.0, -5.0)


def test_sticky_keeps_a_trajectory_on_its_first_engine_and_moves_it_when_that_engine_is_out():
    p = Sticky()
    # first request of t1: least-loaded (b), remembered
    assert p.pick(cands((A, 0, 5), (B, 0, 1)), 64, "t1").index == 1 and p.home("t1") == B
    # next turns stay on b though a is now idle and holds more
    assert p.pick(cands((A, 64, 0), (B, 0, 7)), 64, "t1").index == 1
    # b is out: least-loaded among the rest, and t1 now lives there
    assert p.pick(cands((A, 0, 3), (C, 0, 1)), 64, "t1").index == 1 and p.home("t1") == C and p.moved == 1
    # b back: t1 stays on c
    assert p.pick(cands((A, 0, 0), (B, 0, 0), (C, 0, 9)), 64, "t1").index == 2
    # no key: placed as least-loaded, nothing remembered
    assert p.pick(cands((A, 0, 1), (B, 0, 0)), 64, None).index == 1 and p.home("None") is None


def test_sticky_forgets_the_oldest_used_trajectory_past_its_bound():
    p = Sticky(max_keys=2)
    for k in ("t1", "t2"):
        p.pick(cands((A, 0, 0)), 64, k)
    p.pick(cands((A, 0, 0)), 64, "t1")            # t1 used again: t2 is the oldest
    p.pick(cands((A, 0, 0)), 64, "t3")
    assert p.home("t1") == A and p.home("t2") is None and p.home("t3") == A
    with pytest.raises(ValueError, match="max_keys"):
        Sticky(max_keys=0)


def test_every_policy_refuses_no_candidates_and_unknown_names_list_the_known():
    for name in POLICIES:
        with pytest.raises(ValueError, match="at least one candidate"):
            make_policy(name).pick([], 10, None)
    with pytest.raises(ValueError, match="unknown routing policy 'random'; known: prefix-load, round-robin, "
                                         "least-loaded, sticky"):
        make_policy("random")
    with pytest.raises(ValueError, match="unknown routing policy"):
        RouterConfig((parse_engine("http://127.0.0.1:8001"),), policy="random")
    assert RouterConfig((parse_engine("http://127.0.0.1:8001"),), policy="sticky").policy == "sticky"
    assert isinstance(make_policy("prefix-load", weights=Weights(0.9)), PrefixLoad)
    assert make_policy("prefix-load", weights=Weights(0.9)).weights.mu == 0.9


def test_the_trajectory_key_is_kvtiers_hint_else_the_first_block():
    hint = {"kv_transfer_params": {"kvtier": {"trajectory_id": "run7:s3", "tool": "bash"}}}
    assert trajectory_key(hint, 123) == "trajectory:run7:s3"
    assert trajectory_key({"prompt": [1, 2]}, 123) == "block:123"
    assert trajectory_key({"prompt": [1, 2]}, None) is None
    # odd hints are no key, never an error
    for odd in ({"kv_transfer_params": "x"}, {"kv_transfer_params": {"kvtier": ["t"]}},
                {"kv_transfer_params": {"kvtier": {"trajectory_id": 5}}},
                {"kv_transfer_params": {"kvtier": {"trajectory_id": ""}}}):
        assert trajectory_key(odd, None) is None


# ------------------------------------------------------------------------------ cache_salt
def test_a_salted_requests_hashes_are_vllms_own():
    kcu = pytest.importorskip("vllm.v1.core.kv_cache_utils")
    from vllm.utils.hashing import get_hash_fn_by_name
    fn = get_hash_fn_by_name("sha256")
    kcu.init_none_hash(fn)
    tokens = [(i * 7919) % 32_000 for i in range(16 * 3 + 2)]
    req = types.SimpleNamespace(cache_salt="run-1", mm_features=[], lora_request=None, prompt_embeds=None)
    parent, want = None, []
    for i in range(0, 16 * 3, 16):
        extra, _ = kcu.generate_block_hash_extra_keys(req, i, i + 16, 0)   # vLLM: the salt in block 0 only
        parent = kcu.hash_block_tokens(fn, parent, tokens[i:i + 16], extra)
        want.append(external(parent))
    h = BlockHasher()
    assert h.hashes(tokens, 16, salt="run-1") == want
    # a salt changes every block (the chain), another salt gives other hashes, no salt is vLLM's unsalted
    plain = h.hashes(tokens, 16)
    assert all(x != y for x, y in zip(plain, want)) and h.hashes(tokens, 16, salt="run-2")[0] != want[0]
    assert h.hashes(tokens, 16, salt="") == plain == h.hashes(tokens, 16, salt=None)
    with pytest.raises(ValueError, match="cache_salt is a string"):
        h.hashes(tokens, 16, salt=7)


# ------------------------------------------------------------------------------ the flag
def test_kvtier_route_policy_flag(capsys):
    import json
    from kvtier.cli.main import main
    assert main(["route", "--engine", "http://127.0.0.1:8001", "--policy", "sticky", "--dry-run", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["policy"] == "sticky"
    assert main(["route", "--engine", "http://127.0.0.1:8001", "--dry-run", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["policy"] == "prefix-load"
    with pytest.raises(SystemExit) as exc:
        main(["route", "--engine", "http://127.0.0.1:8001", "--policy", "random", "--dry-run"])
    assert exc.value.code == 2 and "invalid choice: 'random'" in capsys.readouterr().err
    # the flag's choices are the registry's
    from kvtier.cli import route
    import argparse
    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    route.register(types.SimpleNamespace(top=sub))
    act = next(a for a in sub.choices["route"]._actions if a.dest == "policy")
    assert list(act.choices) == list(POLICIES)


# ------------------------------------------------------------------------------ through the proxy
def test_the_proxy_hashes_a_requests_salt_and_sticky_keeps_a_trajectory_on_its_engine(engines, pubs):
    """Two OpenAI-shaped engines behind the proxy (tests/test_routing_proxy.py's)."""
    import httpx
    a, b = engines
    salted = {**CHAT, "cache_salt": "run-1"}
    app, srv = router()
    try:
        pub = joined(app, pubs)
        hashes = BlockHasher().hashes(tokens_of(CHAT), 16, salt="run-1")
        pub[B].send(BlockStored(hashes, None, 16, "GPU"))
        until(lambda: app.directory.match(B, hashes, 16).blocks == len(hashes), "B's salted blocks applied")
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            # B holds the salted prompt: the salted request goes to B
            assert c.post("/v1/chat/completions", json=salted).headers["x-kvtier-engine"] == B
            # the same messages without the salt are other blocks (none held): the tie goes to A
            assert c.post("/v1/chat/completions", json=CHAT).headers["x-kvtier-engine"] == A
    finally:
        srv.stop()
    app, srv = router(policy="sticky")
    try:
        def turn(tid: str) -> str:
            body = {**CHAT, "kv_transfer_params": {"kvtier": {"trajectory_id": tid, "tool": "bash"}}}
            return c.post("/v1/chat/completions", json=body).headers["x-kvtier-engine"]

        with httpx.Client(base_url=srv.url, timeout=30) as c:
            first = turn("t1")
            other = B if first == A else A
            # the first engine's queue grows: t1 stays there, a new trajectory goes to the other
            (a if first == A else b).waiting = 5
            load_seen(app, first, 5)
            assert turn("t1") == first and turn("t2") == other and turn("t1") == first
    finally:
        srv.stop()
