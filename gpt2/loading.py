"""Load a GPT-2: `load_gpt2(name_or_path)` finds the weights (gpt2/checkpoints.py: the hub, a
folder or a .safetensors file) and returns gpt2/model.py as written: float32 parameters holding the
file's values (or the dtype asked for), every linear layer an nn.Linear, nothing attached.

Speed is one explicit step of its own, gpt2.speed.accelerate (the scripts take it and say so);
load_gpt2's speed options (dtype="auto", quantize, compile) take that step for the caller.

The model is built on the "meta" device (no memory, no random init), so the loaded tensors become
its parameters directly: peak memory stays near the size of the weights.
"""

from pathlib import Path

from .checkpoints import (CONV1D_SUFFIXES, DTYPES, STANDINS_COMMAND, TRAIN_PAIR_COMMAND,  # noqa: F401 (its names)
                          CheckpointError, check_local_checkpoint, check_tensor_names_and_shapes,
                          checkpoint_errors, empty_model, inferred_config, peek_config, read_header,
                          read_tensor, resolve_checkpoint, resolve_device, resolve_dtype)
from .config import GPT2Config
from .model import GPT2


def load_gpt2(name_or_path, device=None, dtype="float32", quantize=None, compile=False) -> GPT2:
    """Load a GPT-2 from the hub or a local path (see the module docstring), in eval mode: the model
    of gpt2/model.py as written, every linear layer an nn.Linear, float32 parameters holding the
    file's values (or the dtype asked for).

    device: "cpu" (None), "cuda", "cuda:N", "mps", "auto" or a torch.device.
    dtype: "float32" (default), "bfloat16", "float16" or the torch dtype; None keeps the dtype stored
    in the file.

    Speed is a separate step, gpt2.speed.accelerate (or its loader gpt2.speed.load_accelerated,
    which reads the file one weight at a time). The speed options below are that step, taken here
    for you; the model returned is then a gpt2.speed FastGPT2, whose repr says what runs where:
    dtype="auto": the weight format measured fastest on this machine for this model's shapes;
    quantize="int8" or "fp16": int8 weights (float32 math) or float16 weights in a float32 model;
    compile=True, "graph", "fused" or "auto": a compiled, fused or CUDA-graph decode step."""
    if speed_asked(dtype, quantize, compile):
        from .speed import load_accelerated  # the speed step (gpt2/speed/), taken when asked for
        return load_accelerated(name_or_path, device=device, dtype=dtype, quantize=quantize, compile=compile)
    device = resolve_device("cpu" if device is None else device)
    dtype = resolve_dtype(dtype)  # a bad dtype fails here, before anything is downloaded
    config, weights_path = resolve_checkpoint(name_or_path)
    return load_safetensors(weights_path, config, device=device, dtype=dtype)


def speed_asked(dtype, quantize, compile) -> bool:
    """Whether load_gpt2's options ask for gpt2.speed's step: dtype "auto", a quantize format, or a
    compiled decode path."""
    return (isinstance(dtype, str) and dtype.lower() == "auto") or quantize is not None or compile is not False


def load_safetensors(path, config: GPT2Config | None = None, device=None, dtype=None) -> GPT2:
    """Build a GPT2 whose parameters are the tensors of a safetensors file (either key layout), in
    eval mode. device and dtype as in load_gpt2, except that dtype None (the default) keeps the
    file's."""
    path = Path(path)
    device = resolve_device("cpu" if device is None else device)
    dtype = resolve_dtype(dtype)
    with checkpoint_errors(path):
        prefix, shapes = read_header(path)
        config = config or inferred_config(shapes, path)
        model = empty_model(GPT2, config)
        expected = {name: tuple(p.shape) for name, p in model.state_dict().items()}
        check_tensor_names_and_shapes(shapes, expected, path)
        state = {name: read_tensor(path, prefix, name).to(device=device, dtype=dtype).contiguous()
                 for name in expected}
    model.load_state_dict(state, assign=True)
    return model.requires_grad_(False).eval()
