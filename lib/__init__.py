"""The machinery under the method scripts: policy and backends, the sandbox, proposers, data from the hub.
Nothing here imports a top-level method script (whale, rft, meta_harness, rollout, domains)."""
