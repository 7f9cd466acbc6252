"""The machinery under the method scripts. At the top, the method's helpers: the flags and typed configs (cli), the
method table (methods), the acceptance rules (rules), the harness contract and the search's archive and proposers.
Below, a sub-package per tier: run_folder/ (the store of finished work and a run's rows), episodes/ (the runner and the sandbox),
backends/ (the policy and its engines), paper/ (the paper's data, retriever and judge), report/ (what report.py
reads and draws) and ops/ (plan.py's operations); and at the floor common/ (the error classes, argument types and
JSON files every tier shares; it imports nothing of the project). Nothing here imports a top-level method script
(whale, rft, meta_harness, rollout, domains), nothing outside report/ and ops/ imports those two, and no import
runs back up from a lower tier to a higher one (`farm-studio look lib`; docs/design.md section 9)."""
