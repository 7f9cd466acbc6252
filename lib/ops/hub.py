"""What this machine has of the Hugging Face hub, for --check (lib/ops/preflight.py): a dataset or a model as a
local file, in the caches, or reachable on the hub, from metadata alone: nothing is downloaded.

    ok, where = dataset_status("BytedTsinghua-SIA/DAPO-Math-17k")   # (True, "cached") or (False, why)
    size = cached_model_bytes("Qwen/Qwen3.5-2B")                    # bytes of cached weights, or None
"""
import importlib.util
import os
from pathlib import Path

from lib.backends.models import BUILTIN

TIMEOUT_S = 10.0  # one look-up (the hub is asked again only while it answers)
LOCAL_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")
GPU_EXTRA = "bash install.sh --gpu (or pip install -r requirements-gpu.txt)"


def is_local(name):
    return os.path.exists(name) or name.endswith(LOCAL_SUFFIXES) or name.startswith((".", "/", "~"))


def dataset_status(name):
    """(ok, where a dataset comes from: a local file, the cache or the hub; or why it cannot be had)."""
    if is_local(name):
        if not os.path.isfile(os.path.expanduser(name)):
            return False, "no such file"
        if name.endswith(".parquet") and importlib.util.find_spec("datasets") is None:
            return False, f"a .parquet file needs the `datasets` package ({GPU_EXTRA})"
        return True, "local file"
    if dataset_cached(name):
        return True, "cached"
    return hub_status("dataset", name)


def dataset_cached(name):
    """In the hub's download cache, or prepared in the datasets cache (folder owner___name), without asking the hub."""
    from huggingface_hub import snapshot_download
    try:
        snapshot_download(name, repo_type="dataset", local_files_only=True)
        return True
    except Exception:  # not cached (LocalEntryNotFoundError), or not a valid repo id
        pass
    home = os.environ.get("HF_HOME", os.path.join(os.path.expanduser("~"), ".cache", "huggingface"))
    folder = Path(os.environ.get("HF_DATASETS_CACHE", os.path.join(home, "datasets")))
    want = name.replace("/", "___").lower()
    return folder.is_dir() and any(p.name.lower() == want for p in folder.iterdir())


HUB_DOWN = {}  # the first reason the hub did not answer: later look-ups fail at once instead of waiting again


def hub_status(kind, name):
    """(ok, 'on the hub' or why not), from the repo's metadata alone (nothing is downloaded)."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import GatedRepoError, HFValidationError, RepositoryNotFoundError
    if constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE") == "1":
        return False, "not cached, and HF_HUB_OFFLINE=1 forbids the hub"
    if not HUB_DOWN:
        try:
            getattr(HfApi(), f"{kind}_info")(name, timeout=TIMEOUT_S)
            return True, "on the hub (downloaded at first use)"
        except GatedRepoError:
            return False, "gated: accept its terms on huggingface.co, then `hf auth login`"
        except (RepositoryNotFoundError, HFValidationError):
            return False, f"no such {kind} on the hub, and no such local path: check the name"
        except Exception as e:  # DNS, refused, timeout, proxy: the hub is down for every later look-up too
            HUB_DOWN["why"] = f"{type(e).__name__}: {str(e)[:100]}"
    return False, f"not cached, and the hub is unreachable ({HUB_DOWN['why']})"


def model_bytes(name):
    """The size of a model's weight files: none to speak of for smoke and cpu; a local folder's; a hub model's in the
    cache; None when not downloaded yet."""
    if name in BUILTIN:
        return 0
    if is_local(name):
        return sum(p.stat().st_size for p in Path(os.path.expanduser(name)).glob("*.safetensors"))
    return cached_model_bytes(name)


def cached_model_bytes(name):
    """The size of a hub model's cached weight files, or None when its config is not cached."""
    from huggingface_hub import try_to_load_from_cache
    try:
        config = try_to_load_from_cache(name, "config.json")
    except Exception:  # not a valid repo id
        return None
    if not isinstance(config, str):
        return None
    return sum(p.stat().st_size for p in Path(config).parent.glob("*.safetensors"))
