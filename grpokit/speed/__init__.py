"""Measured CPU speed-ups, each behind its own config flag, none changing a number.

- ``attention``: the training forward's attention backward (``attention_backward``)
- ``fastdecode``: the fused Llama/Mistral/Qwen2 decode step (``fused_decode``)
- ``prefix``: a batch's common prompt prefix prefilled once (``share_prompt_prefix``)
- ``heap``: bounded heap release after a step (glibc ``malloc_trim``)
- ``pool``: large CPU tensors from their own address range (``cpu_memory_pool``)
- ``weights``: sparse tied-embedding gradient, frozen linears stored in bf16

docs/speed.md has the measurements behind each one.
"""
