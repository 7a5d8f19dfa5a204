"""Failing fast on a Hugging Face hub id that can be loaded neither from the hub nor from the local cache.

Offline, transformers retries every file request with backoff: about 50 s and 22 lines of retry warnings before
its error. Before a hub id that is not in the local cache is loaded, the hub is asked once for any answer, with a
short timeout; no answer (or HF_HUB_OFFLINE set) is one UserError now. When the hub answers, loading goes on
through transformers' own code path unchanged.
"""

from __future__ import annotations

import http.client
import urllib.error
import urllib.request

from purplerl.errors import UserError, first_line

PROBE_TIMEOUT_S = 5.0  # a hub that does not answer a HEAD in 5 s will not serve a model either


def hub_cached(repo_id: str, revision: str | None) -> bool:
    """Whether the local HF cache holds `repo_id`'s config.json at `revision` (what every model load reads first)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json", revision=revision), str)
    except ValueError:  # not a valid repo id: transformers names the problem when it loads it
        return True


def hub_unreachable(endpoint: str, repo_id: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the hub at `endpoint` gave no HTTP answer about `repo_id` within `timeout_s`, or None when it answered
    (any status is an answer: a gated or missing model is transformers' to report). urllib follows the *_proxy
    environment variables as the hub client does."""
    request = urllib.request.Request(f"{endpoint.rstrip('/')}/api/models/{repo_id}", method="HEAD")
    try:
        urllib.request.urlopen(request, timeout=timeout_s).close()
    except urllib.error.HTTPError:
        return None
    except urllib.error.URLError as err:
        return first_line(str(err.reason))
    except (OSError, http.client.HTTPException) as err:
        return first_line(err)
    return None


def require_hub_model(repo_id: str, revision: str | None) -> None:
    """Raise one UserError when hub id `repo_id` is not cached locally and the hub cannot be reached."""
    from huggingface_hub import constants

    if hub_cached(repo_id, revision):
        return
    where = f"it is not in the local Hugging Face cache ({constants.HF_HUB_CACHE})"
    if constants.HF_HUB_OFFLINE:
        raise UserError(f"cannot load model '{repo_id}': {where} and HF_HUB_OFFLINE is set")
    why = hub_unreachable(constants.ENDPOINT, repo_id)
    if why is not None:
        raise UserError(f"cannot load model '{repo_id}': the Hugging Face hub {constants.ENDPOINT} is unreachable "
                        f"({why}) and {where}")
