"""Attention ops over Fluxo's paged KV cache: a torch reference (any device, ``kernels.attention``)
and a Triton kernel (CUDA, ``kernels.triton_attention``); the CPU quantized matmuls
(``kernels.cpu_quant``). Import each from its module."""
