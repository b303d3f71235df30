"""Speed for the model, kept apart from it: gpt2/model.py never imports any of this, and
load_gpt2 returns that model as written. The one step that makes it fast:

    fast = gpt2.speed.accelerate(model, format="auto")     # or gpt2.speed.load_accelerated(path)

returns a FastGPT2 (fast_model.py) whose repr says which weight format and kernel run each layer.
Behind it: which kernel runs each linear layer on this machine (kernels, fast_linear, native and its
C source, kernel_cache, kernel_report), the weights as the bytes their kernels read
(stored_weights, weight_cache), the compiled decode step and CUDA graphs (compiled, cuda_graph),
device and dtype choice (device), and the busy-machine note (machine_load). See README.md beside
this file.
"""


from .accelerator import FORMATS, accelerate, load_accelerated, speed_line
from .fast_model import FastEmbedding, FastGPT2, FastLinear

__all__ = ["accelerate", "load_accelerated", "speed_line", "FORMATS", "FastGPT2", "FastLinear", "FastEmbedding"]
