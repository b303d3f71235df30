"""What the grader serves a check's probe while it runs: a model whose forward passes run in the
grader's process, where they are counted.

Why: the student's process can patch anything in it (hooks, counters, the json module), so a
count made there proves nothing. A check that must know how often the student's code ran the
target (did it speculate, or decode one token per target forward?) gets a target that is not in
the student's process at all: its weights stay with the grader (re-drawn from a secret seed, so
they cannot be rebuilt from the copy's code either), and every forward is a request over a socket
the grader opened. The grader answers it with logits and counts it; the judge reads the grader's
count, never one the child reports.

    grader process                                  the check's child process
    Server.handle(request) -> response   <- socket ->  ask(request) (ServedGPT2.forward)
    Server.record() -> what it counted, for the judge

Messages are JSON, each preceded by its length (4 bytes, big-endian).
"""

import functools
import json
import socket
import struct
import threading
from pathlib import Path

import torch

MAX_MESSAGE_BYTES = 4 * 2**20  # a request or answer larger than this ends the conversation
MAX_REQUESTS = 20_000  # a check's probe asking more than this is cut off (the check then fails)
MAX_RECORDED = 2_000  # requests a TargetServer keeps (what they asked), for the judge to read


# ------------------------------------------------------------------------------------------------
# The wire
# ------------------------------------------------------------------------------------------------

def send(sock: socket.socket, message) -> None:
    data = json.dumps(message).encode()
    sock.sendall(struct.pack(">I", len(data)) + data)


def receive(sock: socket.socket):
    """The next message, or None when the other end closed (or sent something malformed)."""
    header = _exactly(sock, 4)
    if header is None:
        return None
    (size,) = struct.unpack(">I", header)
    if size > MAX_MESSAGE_BYTES:
        return None
    data = _exactly(sock, size)
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


def _exactly(sock: socket.socket, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        try:
            chunk = sock.recv(min(n - got, 1 << 16))
        except OSError:
            return None
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


# ------------------------------------------------------------------------------------------------
# The grader's side
# ------------------------------------------------------------------------------------------------

class Server:
    """What a check serves: handle(request) -> response (a dict, JSON), record() -> what it counted."""

    def handle(self, request: dict) -> dict:
        raise NotImplementedError

    def record(self) -> dict:
        return {}


class NothingServed(Server):
    """For the checks that ask nothing: any request is answered with an error."""

    def handle(self, request):
        return {"error": "this check serves nothing"}


def serve_in_thread(server: Server, sock: socket.socket) -> threading.Thread:
    """Answer the child's requests on sock until it closes its end (or the grader closes sock)."""

    def loop():
        for _ in range(MAX_REQUESTS):
            request = receive(sock)
            if request is None:
                return
            try:
                response = server.handle(request) if isinstance(request, dict) else {"error": "not a request"}
            except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as error:
                response = {"error": f"bad request ({type(error).__name__}: {error})"}
            try:
                send(sock, response)
            except OSError:
                return

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


# ------------------------------------------------------------------------------------------------
# The child's side
# ------------------------------------------------------------------------------------------------

class _Channel:
    """The probe's end: a socket to the grader (in a check's child), or a Server called directly
    (the grader running the instructor's code through a check: references.reference_passes)."""

    def __init__(self, sock: socket.socket | None = None, server: Server | None = None):
        self.sock, self.server = sock, server

    def ask(self, request: dict) -> dict:
        if self.server is not None:
            return self.server.handle(json.loads(json.dumps(request)))
        send(self.sock, request)
        response = receive(self.sock)
        if response is None:
            raise ConnectionError("the grader stopped answering (too many requests?)")
        return response


_channel: _Channel | None = None


def connect(fd: int) -> None:
    """In a check's child: requests go to the grader over the socket at fd."""
    global _channel
    _channel = _Channel(sock=socket.socket(fileno=fd))


def serve_here(server: Server | None) -> None:
    """In the grader: requests go to `server` in this process (None: no channel)."""
    global _channel
    _channel = _Channel(server=server) if server is not None else None


def ask(request: dict) -> dict:
    if _channel is None:
        raise ConnectionError("this check has no channel to the grader")
    response = _channel.ask(request)
    if "error" in response:
        raise RuntimeError(f"the grader refused a request: {response['error']}")
    return response


# ------------------------------------------------------------------------------------------------
# A served GPT-2 target
# ------------------------------------------------------------------------------------------------

SHARED_BLOCKS, DAMPING = 2, 0.1  # as references.make_data's agreeing pair (its draft has 2 blocks)


def secret_target(data: Path, secret: int):
    """The target the grader serves: data/target's embeddings, first SHARED_BLOCKS blocks and
    final LayerNorm (so the draft, which has exactly those, still agrees with it most of the
    time), its later blocks re-drawn from `secret` and damped as save_agreeing_pair damps them.
    Nothing in the student's copy can rebuild it without the secret."""
    from gpt2 import load_gpt2
    from offline.random_weights import random_hub_state_dict

    model = load_gpt2(Path(data) / "target")
    fresh = random_hub_state_dict(model.config, secret, 0.2, 0.3)
    with torch.no_grad():
        for i in range(SHARED_BLOCKS, model.config.n_layer):
            for name, parameter in model.h[i].named_parameters():
                value = fresh[f"h.{i}.{name}"].reshape(parameter.shape).to(parameter.dtype)
                if name.startswith(("attn.c_proj", "mlp.c_proj")):
                    value = value * DAMPING
                parameter.copy_(value)
    return model


class TargetServer(Server):
    """Serves forwards of a model over whole sequences (no cache: each request carries every
    token), counting them: the judge's evidence of how often the student's code ran the target."""

    def __init__(self, model, facts: dict | None = None):
        self.model, self.facts = model, facts or {}
        self.forwards, self.positions, self.requests = 0, 0, []

    def handle(self, request):
        if "fact" in request:  # a value of the check's that only the grader knows (e.g. an eos token)
            return {"value": self.facts[request["fact"]]}
        tokens, last = request["tokens"], request["last"]
        n = self.model.config.n_positions
        if not (isinstance(tokens, list) and 0 < len(tokens) <= n and type(last) is int and 1 <= last <= len(tokens)
                and all(type(t) is int and 0 <= t < self.model.config.vocab_size for t in tokens)):
            raise ValueError(f"tokens must be 1..{n} token ids and last between 1 and their number")
        self.forwards += 1
        self.positions += last
        if len(self.requests) < MAX_RECORDED:
            self.requests.append([tokens, last])
        with torch.inference_mode():
            logits = self.model(torch.tensor([tokens]), num_last_logits=last)[0]
        return {"logits": logits.tolist()}

    def record(self):
        return {"forwards": self.forwards, "positions": self.positions, "requests": self.requests}


def served_model(data: Path, name: str = "target"):
    """In the probe: a GPT2 shaped like data/<name> whose forwards are answered by the grader
    (a GPT2 whose forward is _served_forward); its own weights are never used."""
    from gpt2 import load_gpt2

    model = load_gpt2(Path(data) / name)
    model.__class__ = _served_class()
    model.histories = {}
    return model


def _served_forward(self, idx, cache=None, num_last_logits=None, exit_layer=None, positions=None,
                    attn_mask=None, return_features=False):
    """GPT2.forward's signature; the logits come from the grader. The sequence so far is what
    this model was fed into `cache` up to cache.length (so a truncated cache drops the rest)."""
    if exit_layer is not None or positions is not None or attn_mask is not None:
        raise ValueError("the served target runs plain causal forwards only (no exit_layer, positions, attn_mask)")
    self._check_input(idx, cache.length if cache is not None else 0, cache)
    if idx.shape[0] != 1:
        raise ValueError("the served target takes one sequence at a time (batch size 1)")
    new = [int(t) for t in idx[0]]
    if cache is not None:
        history = self.histories.get(id(cache), [])[:cache.length] + new
        self.histories[id(cache)] = history
        cache.advance(len(new))
    else:
        history = new
    last = len(new) if num_last_logits is None else min(num_last_logits, len(new))
    logits = torch.tensor(ask({"tokens": history, "last": last})["logits"], dtype=torch.float32)[None]
    if return_features:
        return logits, torch.zeros(1, len(new), self.config.n_embd)  # no feature drafter here
    return logits


@functools.cache
def _served_class():
    from gpt2 import GPT2  # here, not at the top: the zygote must not import the student's code

    return type("ServedGPT2", (GPT2,), {"forward": _served_forward, "__doc__": _served_forward.__doc__})
