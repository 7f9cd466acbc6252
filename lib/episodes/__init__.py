"""Episodes: the runner's event loop, the pool of harness processes and the process inside it, and the OS sandbox
(sandbox.py, seccomp.py, cgroups.py, egress.py, python_tool.py, switches.py: README "Files")."""
