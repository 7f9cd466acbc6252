#!/usr/bin/env bash
# Search-R1's retrieval server (e5-base-v2 over wiki-18 in a flat FAISS index), the paper's searchqa retriever,
# on port 8010 (8000 is `vllm serve`'s and --openai-url's default), for --retriever-url http://127.0.0.1:8010/retrieve:
#
#     bash scripts/search_r1_retriever.sh setup DIR   # once: conda env `retriever`, Search-R1's checkout, index + corpus
#     bash scripts/search_r1_retriever.sh serve DIR   # start it (foreground; run it in tmux or with nohup)
#     bash scripts/search_r1_retriever.sh check       # one query through the client the runs use
#
# What it takes (Search-R1's README and the index's size; not measured here): a separate conda environment (faiss-gpu
# comes from conda, with its own torch 2.4 / CUDA 12.1, apart from WHALE-repro's venv); about 60-70 GB to download
# and about 130 GB on disk once the index parts are joined and the corpus unzipped (keep DIR on a large disk); about
# 65 GB of host RAM (the corpus and the index are read into memory before the index moves to the GPU); 10-20
# minutes from `serve` to the first answer; on the GPU, the index in fp16 takes about 32 GiB (lib/ops/time_model.py:
# RETRIEVER_GPU_BYTES), which fits beside the trainer and the engine only on an 80 GB card (a smaller card: put the
# index on a second GPU with CUDA_VISIBLE_DEVICES, or drop --faiss_gpu and let the CPU answer, slower).
# The runs' client (lib/paper/retriever.RetrieverClient) sends one request at a time, batching the queries that wait:
# the server answers from a thread pool and a FAISS GPU index is not thread-safe.
set -euo pipefail
PORT=${RETRIEVER_PORT:-8010}
ENV=${RETRIEVER_ENV:-retriever}
die() { echo "search_r1_retriever.sh: $*" >&2; exit 1; }

setup() {
  local dir=$1
  command -v conda > /dev/null || die "needs conda (faiss-gpu comes from conda only): install Miniforge, then rerun"
  mkdir -p "$dir"
  if ! conda env list | grep -q "^$ENV "; then  # Search-R1's README: "Retriever environment"
    conda create -y -n "$ENV" python=3.10
    conda install -y -n "$ENV" pytorch==2.4.0 pytorch-cuda=12.1 -c pytorch -c nvidia
    conda install -y -n "$ENV" -c pytorch -c nvidia faiss-gpu=1.8.0
    conda run -n "$ENV" pip install transformers datasets uvicorn fastapi huggingface_hub
  fi
  [ -d "$dir/Search-R1" ] || git clone --depth 1 https://github.com/PeterGriffinJin/Search-R1 "$dir/Search-R1"
  if [ ! -f "$dir/e5_Flat.index" ]; then  # the index parts and wiki-18.jsonl.gz (tens of GB)
    (cd "$dir/Search-R1" && conda run -n "$ENV" python scripts/download.py --save_path "$dir")
    cat "$dir"/part_* > "$dir/e5_Flat.index" && rm "$dir"/part_*
  fi
  [ -f "$dir/wiki-18.jsonl" ] || gzip -dk "$dir/wiki-18.jsonl.gz"
  echo "search_r1_retriever.sh: ready in $dir: bash scripts/search_r1_retriever.sh serve $dir"
}

serve() {
  local dir=$1
  [ -f "$dir/e5_Flat.index" ] && [ -f "$dir/wiki-18.jsonl" ] || die "no index or corpus in $dir: run setup $dir first"
  cd "$dir/Search-R1"
  # retrieval_server.py's own launch line (retrieval_launch.sh); uvicorn.run is wrapped so it listens on $PORT
  # whatever port the checkout's __main__ names, without editing its source
  exec conda run --no-capture-output -n "$ENV" python -c "
import runpy, sys, uvicorn
run = uvicorn.run
uvicorn.run = lambda app, **kw: run(app, **{**kw, 'host': '127.0.0.1', 'port': $PORT})
sys.argv[0] = 'search_r1/search/retrieval_server.py'
runpy.run_path(sys.argv[0], run_name='__main__')
" --index_path "$dir/e5_Flat.index" --corpus_path "$dir/wiki-18.jsonl" --topk 3 --retriever_name e5 \
    --retriever_model intfloat/e5-base-v2 --faiss_gpu
}

check() {
  cd "$(dirname "$0")/.."
  if [ -z "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" ] && [ -x .venv/bin/python ]; then PATH="$PWD/.venv/bin:$PATH"; fi
  PYTHONPATH=$PWD python -c "
from lib.paper import retriever
print('ok', retriever.RetrieverClient('http://127.0.0.1:$PORT/retrieve', timeout=30).search('who wrote the iliad', k=1))"
}

case "${1:-}" in
  setup) [ -n "${2:-}" ] || die "setup DIR: where the index and corpus go (about 130 GB)"; setup "$(realpath -m "$2")" ;;
  serve) [ -n "${2:-}" ] || die "serve DIR: the folder setup filled"; serve "$(realpath -m "$2")" ;;
  check) check ;;
  *) die "usage: bash scripts/search_r1_retriever.sh setup DIR | serve DIR | check" ;;
esac
