"""The project's own error classes: raised by the sandbox, the retriever and rollout's error budget; caught by the
runner and by every command line (cli.project_errors). At lib/'s floor, so that any tier may raise or catch them."""


class SandboxError(RuntimeError):
    pass


class InfrastructureError(RuntimeError):
    """A failure outside the harness's own code: a tool server that did not answer, a sandbox the kernel refused,
    a run over its error budget. A tool raises it instead of returning an error for the harness to read: the
    runner ends the episode as the machine's failure, not the candidate's (rollout.INFRA_ERRORS counts them)."""
