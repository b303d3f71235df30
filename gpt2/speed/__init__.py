"""The speed machinery around the model, kept apart from it: which kernel runs each linear layer on
this machine (kernels, fast_linear, native and its C source, kernel_cache, kernel_report), the
compiled decode step and CUDA graphs (compiled, cuda_graph), device and dtype choice (device), and
the busy-machine note (machine_load). The model (gpt2/model.py) never imports any of it:
load_gpt2(..., kernels=False) runs it as plain PyTorch. See README.md beside this file.
"""
