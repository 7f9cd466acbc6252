"""searchqa's retrievers over Wikipedia 2018, for `--data paper`: Search-R1's retrieval server (e5 over wiki-18,
--retriever-url; scripts/search_r1_retriever.sh starts one) or, without one, bm25s over a wiki-18 .jsonl file
(--wiki). A passage's title keeps wiki-18's quotes ('"Paris": ...'), as the official tool shows it
(Doc 1 (Title: "Paris")). One retriever per process (shared_retriever), whatever the number of episodes.

    retriever = shared_retriever(url, wiki, wiki_limit)   # a RetrieverClient or a WikiBM25
    passages = retriever.search("who wrote the iliad", k=3)
"""
import gzip
import json
import os
import threading
import time

from lib.paper import web
from lib.common.errors import InfrastructureError


def passage_text(contents):
    """wiki-18 / Search-R1 `contents` ('"Title"\\ntext') -> '"Title": text', the bundled corpus' form with the
    title as wiki-18 writes it, quotes kept (the official tool's "Doc 1 (Title: "Paris")")."""
    title, _, text = str(contents).partition("\n")
    return f"{title.strip()}: {text.strip()}"


RETRIEVER_URL = "http://127.0.0.1:8010/retrieve"  # scripts/search_r1_retriever.sh's port: 8000 is vllm serve's
# Search-R1's retrieval server: scripts/search_r1_retriever.sh sets it up (a conda env, ~130 GB of index and corpus)
# and starts it as its retrieval_launch.sh does, on port 8010
SEARCH_R1_SERVER = "bash scripts/search_r1_retriever.sh setup DIR, then serve DIR"
WIKI_DOWNLOAD = "hf download PeterJinGo/wiki-18-corpus wiki-18.jsonl.gz --repo-type dataset --local-dir DIR"
SKIP_SEARCHQA = 'leave searchqa out (run_all.sh: DOMAINS="math chess")'
BM25_UNDER_PAPER = "the paper preset takes it only with --paper-with-bm25"  # lib/cli.py refuses it otherwise


def check_flags(args):
    """The paper's searchqa has a retriever, before any model loads: --retriever-url, or a --wiki file whose first
    line is a wiki-18 passage (the rest is read as it is indexed). The check of every CLI (domains.check_inputs)
    and the first step of --check's (lib/ops/preflight.py), which then also asks the server."""
    if not (args.retriever_url or args.wiki):
        raise ValueError(f"searchqa on the paper's data needs a retriever: start Search-R1's server "
                         f"(`{SEARCH_R1_SERVER}`, sizes and time in the script) and pass --retriever-url "
                         f"{RETRIEVER_URL}, or pass --wiki wiki-18.jsonl.gz (bm25s, not the paper's retriever: "
                         f"{BM25_UNDER_PAPER}; `{WIKI_DOWNLOAD}`), or {SKIP_SEARCHQA}")
    if not args.wiki:
        return
    if not os.path.isfile(args.wiki):
        raise ValueError(f"--wiki {args.wiki}: no such file: `{WIKI_DOWNLOAD}` (a .jsonl.gz is read as downloaded), "
                         "or pass --retriever-url for Search-R1's server")
    try:
        first_wiki_passage(args.wiki)
    except ValueError as e:
        raise ValueError(f"--wiki {args.wiki} is not a wiki-18 .jsonl or .jsonl.gz file ({e}): each line must be "
                         '{"id": ..., "contents": "\\"Title\\"\\ntext"}, as Search-R1\'s wiki-18.jsonl') from None


RETRY_WAIT_S = 5.0  # before a failed request's one retry: a dropped connection or a server restarting


class MalformedReply(InfrastructureError):
    """The server answered, but not as Search-R1's /retrieve does: the machine's failure too (a proxy's error page,
    another service on the port), never a tool result the harness reads. cause: what was wrong with it."""

    def __init__(self, url, cause):
        self.cause = cause
        super().__init__(f"retrieval server {url} sent a malformed reply ({cause}); --retriever-url must be "
                         "Search-R1's retrieval_server.py (the URL ends in /retrieve)")


class RetrieverClient:
    """Search-R1's retrieval server: POST {"queries", "topk", "return_scores"} -> {"result": [[hit, ...], ...]}.
    One request at a time: the server answers from a thread pool and its FAISS GPU index is not thread-safe, so
    the episodes' concurrent searches queue here and leave as one batch per request (search). A failed request
    is sent once more after retry_wait s (None: not again, as the preflight asks); a second failure fails every
    query of its batch as InfrastructureError, which rollout's error budget counts."""

    def __init__(self, url=RETRIEVER_URL, timeout=60.0, retry_wait=RETRY_WAIT_S):
        self.url, self.timeout, self.retry_wait = url, timeout, retry_wait
        self.sending = threading.Lock()  # held while a request is in flight
        self.queue, self.queue_lock = [], threading.Lock()

    def search_batch(self, queries, k=1):
        with self.sending:
            return self.post(queries, k)

    def search(self, query, k=1):
        """One query's passages. It joins the queue; whichever searcher next holds the connection sends every
        queued query of the same k in one request and hands each its result (or the request's error)."""
        mine = {"query": query, "k": k}
        with self.queue_lock:
            self.queue.append(mine)
        with self.sending:
            if "hits" not in mine and "error" not in mine:
                with self.queue_lock:
                    batch = [q for q in self.queue if q["k"] == k]
                    self.queue = [q for q in self.queue if q["k"] != k]
                try:
                    for q, hits in zip(batch, self.post([q["query"] for q in batch], k)):
                        q["hits"] = hits
                except Exception as e:  # every query of the batch fails as its request did
                    for q in batch:
                        q["error"] = e
        if "error" in mine:
            raise mine["error"]
        return mine["hits"]

    def post(self, queries, k):
        """Each query's passages, from one request or, after retry_wait s, its retry."""
        try:
            return self.post_once(queries, k)
        except InfrastructureError as e:
            if self.retry_wait is None:
                raise
            print(f"retriever: {e}; sending the batch of {len(queries)} again in {self.retry_wait:g} s", flush=True)
        time.sleep(self.retry_wait)
        return self.post_once(queries, k)

    def post_once(self, queries, k):
        try:
            reply = web.request(self.url, {"queries": list(queries), "topk": k, "return_scores": True},
                                timeout=self.timeout)
        except (web.URLError, OSError) as e:
            raise InfrastructureError(
                f"retrieval server {self.url} failed ({e}): start Search-R1's retrieval_server.py or pass --wiki PATH "
                f"to search a corpus file with bm25s ({BM25_UNDER_PAPER})") from None
        try:
            return hits_of(json.loads(reply), len(queries))
        except (KeyError, TypeError, AttributeError, ValueError) as e:  # ValueError: not JSON, too few lists
            raise MalformedReply(self.url, f"{type(e).__name__}: {e}") from None


def hits_of(reply, n):
    """Search-R1's reply to n queries -> each query's passages. With return_scores each hit is {"document": {...},
    "score": s}; without, the document itself."""
    result = reply["result"]
    if len(result) != n:
        raise ValueError(f"{len(result)} hit lists for {n} queries")
    return [[passage_text((h.get("document") or h)["contents"]) for h in hits] for hits in result]


def open_text(path):
    """A text file, read through gzip when it is one (Search-R1 ships the corpus as wiki-18.jsonl.gz)."""
    with open(path, "rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rt", encoding="utf-8") if gzipped else open(path, encoding="utf-8")


def first_wiki_passage(path):
    """The first passage of a wiki-18 .jsonl or .jsonl.gz (only its first line is read: the rest waits for the index);
    a file of another shape is a ValueError saying what its first line is."""
    try:
        with open_text(path) as f:
            row = json.loads(f.readline())
    except (OSError, EOFError, ValueError) as e:  # ValueError: not JSON, not UTF-8
        raise ValueError(f"{type(e).__name__}: {e}") from None
    if not (isinstance(row, dict) and isinstance(row.get("contents"), str)):
        raise ValueError(f"line 1 is a JSON {type(row).__name__} without a 'contents' string")
    return passage_text(row["contents"])


SHARED, SHARED_LOCK = {}, threading.Lock()


def shared_retriever(url=None, wiki=None, wiki_limit=None):
    """The retriever of --retriever-url or --wiki, made once per process: every run and domain object in it shares
    one client (so one queue to the server) or one loaded corpus, whose load time it says."""
    key = (url, os.path.realpath(wiki) if wiki else None, wiki_limit)
    with SHARED_LOCK:
        if key not in SHARED:
            if url:
                SHARED[key] = RetrieverClient(url)
            else:
                start = time.time()
                SHARED[key] = WikiBM25(wiki, wiki_limit)
                print(f"--wiki {wiki}: {len(SHARED[key].passages):,} passages and their bm25s index loaded in "
                      f"{time.time() - start:.0f} s, once for this process", flush=True)
        return SHARED[key]


class WikiBM25:
    """bm25s over a wiki-18 style .jsonl file, or the .jsonl.gz as downloaded ({"id", "contents": '"Title"\\ntext'});
    the index is built once (slow for the full 21M passages: use `limit` for a slice) and saved beside the file."""

    def __init__(self, path, limit=None):
        import bm25s
        if not os.path.exists(path):
            raise FileNotFoundError(f"wiki corpus {path} not found: download Search-R1's wiki-18.jsonl.gz or pass "
                                    "--retriever-url for a retrieval server")
        index_dir = f"{path}.bm25s" + (f"-{limit}" if limit else "")
        self.passages = []
        with open_text(path) as f:
            for lineno, line in enumerate(f, 1):
                if limit and len(self.passages) >= limit:
                    break
                try:
                    self.passages.append(passage_text(json.loads(line)["contents"]))
                except (ValueError, TypeError, KeyError):
                    raise ValueError(f"wiki corpus {path}: line {lineno} is not a JSON object with a 'contents' "
                                     "string: fix or remove that line") from None
        if os.path.isdir(index_dir):
            self.retriever = bm25s.BM25.load(index_dir)
        else:
            self.retriever = bm25s.BM25()
            self.retriever.index(bm25s.tokenize(self.passages, stopwords="en", show_progress=False), show_progress=False)
            self.retriever.save(index_dir)

    def search(self, query, k=1):
        import bm25s
        tokens = bm25s.tokenize([str(query)[:2000]], stopwords="en", return_ids=False, show_progress=False)
        if not tokens[0]:
            return []
        ids, scores = self.retriever.retrieve(tokens, k=min(k, len(self.passages)), show_progress=False)
        return [self.passages[i] for i, s in zip(ids[0], scores[0]) if s > 0]
