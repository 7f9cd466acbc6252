"""Episodes: the runner's event loop, the OS sandbox, the pool of harness processes and the process inside it."""
