"""The store of finished work: every result a run may take instead of computing it, kept once under the key of
exactly what produced it, and found by every method and every later command on the same domain, preset and seed.
It lies beside their run folders: results/<preset>[/seed-<n>]/<domain>/store/ (for --out DIR: store/ beside DIR);
rft.py and meta_harness.py run alone keep their own in their run folder, OUT/store; a command under
--unsafe-no-sandbox keeps its work in store-unconfined/ beside (store_in).

    item = store.find("weights", key)          # the item's folder, else None (never made, or damaged: removed)
    item = store.put("weights", key, ckpt)     # a copy of a file or folder ({name: path} for several), in place
    with only_command(root, own_root): ...     # one command at a time on these stores
    copy_item(item, folder)                    # an item's work copied out, without key.json

An item is store/<kind>/<sha256 of its key>/: a copy of the work and key.json (the key in full, `about`: the run
that made it, the sha256 of every file as it was put, and the sha256 of those three), built in a temporary folder
and renamed into place (an older one moved aside until then), so a kill leaves an item whole. The kinds: weights (a
weight phase's RSFT checkpoint after its last step so far, with the phase's step rows), search (a harness archive
after its last round so far) and evaluation (evaluation.json and its traces). An item of a phase or search in
progress is replaced after every step or round: the store is where a run's progress lives, and a killed run goes on
from there. What each key holds, and what it does not: docs/design.md section 9. A find serves only what was stored:
key.json is as put wrote it, its key the key looked up, every file hashes as it did at put, none was added
(check_stored): the item is what its put copied, and a put copies only finished work (a step saved, a round indexed,
an evaluation written). One that fails is removed, said in one line, and computed again by the caller from the same
inputs (the same seeds give the same result), never used. Items and runs hold copies, never hard links, so editing a
run's files never edits the store.
It runs nothing: whale.py's phases do the work."""
import fcntl
import hashlib
import json
import os
import shutil
from contextlib import ExitStack, contextmanager
from functools import lru_cache
from pathlib import Path

from lib.common.json_files import json_object, read_json, sha256, write_json
from lib.run_folder.files import copy_tree

ROOT = Path(__file__).resolve().parents[2]
DAMAGED = "it is removed and computed again"


@lru_cache(maxsize=None)
def code_sha():
    """What can change a result besides the inputs a key names: the project's code (the scripts at the root and
    lib/) and its bundled data (data/*.jsonl), one sha256 that every key holds, so a store never gives work that
    another version of either made (an edit there, a comment too, computes the work again)."""
    h = hashlib.sha256()
    for path in sorted([*ROOT.glob("*.py"), *ROOT.glob("lib/**/*.py"), *ROOT.glob("data/*.jsonl")]):
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def store_in(folder, unconfined=False):
    """The store a command keeps in `folder`: store/, or for a command under --unsafe-no-sandbox store-unconfined/
    beside it (its harness and proposer code run as the user, who could change what it puts or takes: a command in the
    sandbox never takes that work, and an unconfined one never another's)."""
    return Path(folder, "store-unconfined" if unconfined else "store")


@contextmanager
def only_command(*roots):
    """The stores at `roots` serve one command at a time (a put replaces a search another command may be copying): a
    second command that needs one of them is refused in one line while the first runs. A command locks the store in
    the sandbox beside its own (store_in(folder), then store_in(folder, unconfined)), so a command in the sandbox and
    one without never run in one folder at once. The lock goes with the process, however it ends; the items a killed
    command was building go when the next one takes the store."""
    with ExitStack() as locks:
        for root in dict.fromkeys(Path(root) for root in roots):  # each once: a second flock of one file would fail
            locks.enter_context(locked(root))
        yield


@contextmanager
def locked(root):
    """One store's lock, and what a killed command left in it put right (only_command)."""
    Path(root).mkdir(parents=True, exist_ok=True)
    with open(Path(root) / "lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(f"{root} is in use by another command: wait for it to end, or run this one in another "
                             "folder (whale.py: another --seed or --out)") from None
        for cut in Path(root).glob("*/*.tmp-*"):  # Store.put's, cut by a kill: no command builds them now
            shutil.rmtree(cut, ignore_errors=True)
        for old in Path(root).glob("*/*.old-*"):  # an item a put moved aside: back in place if a kill left none there
            item = old.with_name(old.name.split(".old-")[0])
            if item.exists():
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(old, item)
        yield


class Store:
    def __init__(self, root):
        self.root = Path(root)
        self.code = code_sha()  # the code as the command found it: every key holds it

    def full_key(self, key):
        """The key in full: with the code that made the work, this command's unless the key names its own (a run's
        rows record the full keys of their items, so that its finished work is found under the code that made it)."""
        return {"code": self.code, **key}

    def item(self, kind, key):
        key = json.dumps(self.full_key(key), sort_keys=True)
        return self.root / kind / hashlib.sha256(key.encode()).hexdigest()

    def find(self, kind, key):
        """The folder of the item of `kind` under `key`, else None: none made, or one that fails its check (another
        key, a file added, removed or edited since its put), removed (the caller computes it again)."""
        item = self.item(kind, key)
        if not (item / "key.json").exists():
            return None
        try:
            check_stored(item, self.full_key(key))
        except (ValueError, OSError) as e:  # OSError: a file it cannot read, an item that is a symlink
            print(f"{item}: damaged ({e}): computed again from the same inputs")
            item.unlink() if item.is_symlink() else shutil.rmtree(item)
            return None
        return item

    def put(self, kind, key, work, about):
        """The item of `kind` under `key`: `work` (a file or folder, or {name in the item: path}) copied in (real
        copies: a later edit of the run's files never reaches the item), then key.json (the key, `about`, and the
        sha256 of every file), renamed into place over any older one (the same phase or search a step or round further).
        -> the item's folder"""
        item = self.item(kind, key)
        tmp = item.with_name(f"{item.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name, path in (work if isinstance(work, dict) else {"": work}).items():
            if Path(path).is_dir():
                shutil.copytree(path, tmp / name, dirs_exist_ok=True)
            else:
                shutil.copy2(path, tmp / name)
        record = {"key": self.full_key(key), "about": about, "files": file_hashes(tmp)}
        write_json(tmp / "key.json", {**record, "sha256": record_sha(record)})
        # the older item moved aside, not deleted, until the new one is in place: a kill between the two renames leaves
        # it beside, and the next command puts it back (only_command)
        old = item.with_name(f"{item.name}.old-{os.getpid()}")
        if item.exists():
            os.replace(item, old)
        os.replace(tmp, item)
        shutil.rmtree(old, ignore_errors=True)
        return item


def file_hashes(item):
    """{path in the item: sha256} of every file in it but key.json (a symlink or another kind of file: ValueError)."""
    hashes = {}
    for path in sorted(Path(item).rglob("*")):
        rel = str(path.relative_to(item))
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            raise ValueError(f"{rel} is not a regular file or folder")
        if path.is_file() and rel != "key.json":
            hashes[rel] = sha256(path)
    return hashes


def record_sha(record):
    """The sha256 of key.json's record (key, about, files) as sorted JSON: `about` is read back too (the search's
    rounds, the run a checkpoint's harness paths name), so an edit of it is seen like an edit of a file."""
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def check_stored(item, key):
    """The item is what its put stored under `key`, else ValueError naming what is not: key.json holds this very
    key (an item renamed or its key.json edited is another key's) and its record as put wrote it, and every file
    the put hashed is there, as it was, with nothing beside it."""
    stored = json_object(item / "key.json", DAMAGED, keys=("key", "about", "files", "sha256"))
    if stored["sha256"] != record_sha({k: stored[k] for k in ("key", "about", "files")}):
        raise ValueError(f"{item / 'key.json'} was edited since it was stored")
    if stored["key"] != json.loads(json.dumps(key)):
        raise ValueError(f"{item / 'key.json'} holds another key")
    hashes = file_hashes(item)
    if not isinstance(stored["files"], dict) or set(hashes) != set(stored["files"]):
        raise ValueError("its files are not the ones it stored")
    edited = [rel for rel, sha in hashes.items() if stored["files"][rel] != sha]
    if edited:
        raise ValueError(f"{edited[0]} was edited since it was stored")


def about(item):
    return read_json(Path(item, "key.json"))["about"]


def copy_item(item, folder):
    """A store item's folder copied to `folder`, without the store's own record (key.json)."""
    copy_tree(item, folder)
    (Path(folder) / "key.json").unlink()
