"""A Hugging Face Hub-compatible HTTP server over a local folder (`nkikit.hub`).

For offline use, CI and private team registries: the real `huggingface_hub` client (and so
`nkikit.kernels` and HF `kernels`) talks to it as to huggingface.co, given `endpoint=URL`.

    from nkikit.hub import running_hub
    with running_hub(tmp_path) as url:
        api = HfApi(endpoint=url, token="x")

Public API: `serve`, `running_hub`, `HubServer`, `create_app`, `main`. Storage format and
guarantees: see `nkikit.hub.storage`. Routes: see `nkikit.hub.app`.
"""

from .app import create_app
from .server import HubServer, main, running_hub, serve

__all__ = ["HubServer", "create_app", "main", "running_hub", "serve"]
