"""One torch thread: on the 2-core CI machines the harness worker processes need the other core, and two
intra-op threads competing with them made small forwards 10-100x slower (measured). Every test runs in
the repo root, with a fresh error budget phase. The slowest tests carry the `slow` marker, so
`pytest -m "not slow" tests` is the fast loop while editing; CI runs them all."""
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
torch.set_num_threads(1)


# the slowest tests (pytest --durations=40 on the 2-core machine, 2026-12-01): whole runs of whale.py, RSFT that
# learns, end-to-end CLIs; each took 10 s or more there
SLOW = {
    "test_archive_security.py::test_recursion_and_size_reject_one_candidate_and_the_search_goes_on",
    "test_cli_errors.py::test_a_refused_input_is_one_line_end_to_end",
    "test_cli_errors.py::test_rft_checkpoint_link_to_a_missing_folder",
    "test_cli_errors.py::test_the_cli_exits_with_one_line_and_no_traceback",
    "test_domains.py::test_chess_view_does_not_say_which_moves_mate",
    "test_driver.py::test_run_all_never_falls_back_to_cpu_on_a_gpu_torch_cannot_use",
    "test_rollout.py::test_time_spent_generating_is_not_charged_to_waiting_harnesses",
    "test_domains.py::test_cli_stats_show_and_errors",
    "test_domain_contract.py::test_every_test_over_the_registry_passes_for_a_fork_domain",
    "test_domains.py::test_prompt_only_lets_a_candidate_change_only_prompt_text",
    "test_domains.py::test_public_hides_answers",
    "test_domains.py::test_splits_sizes_and_disjoint",
    "test_gpu_path.py::test_canary_below_the_noise_goes_on_and_stale_weights_still_stop",
    "test_gpu_path.py::test_canary_small_adapter_uses_the_differential",
    "test_gpu_path.py::test_canary_tells_served_from_base_and_stale",
    "test_gpu_path.py::test_canary_zero_adapter_and_bf16_noise",
    "test_gpu_path.py::test_openai_backend_canary",
    "test_meta_harness.py::test_end_to_end_smoke_mutate",
    "test_preflight.py::test_paper_run_all_without_a_retriever_exits_in_seconds_with_one_line",
    "test_report.py::test_tables_and_bands_come_from_the_per_task_scores",
    "test_reporting.py::test_whale_run_reports_rsft_steps_harness_rounds_and_test_phases",
    "test_rft.py::test_learning_raises_the_training_reward",
    "test_rft.py::test_resume_matches_an_uninterrupted_run_and_counts_accepted_rollouts",
    "test_ranks.py::test_the_update_over_two_ranks_equals_one_process_and_resumes_exactly_across_a_kill",
    "test_ranks.py::test_a_failing_follower_stops_rank_0_in_bounded_time",
    "test_ranks.py::test_rank_0_failing_tells_the_followers_to_stop",
    "test_ranks.py::test_whale_runs_two_methods_on_two_ranks_and_its_summary_says_so",
    "test_run_all.py::test_a_failed_domain_leaves_the_others_to_finish_and_the_rerun_does_only_it",
    "test_run_folder.py::test_a_damage_that_the_resume_does_not_read_leaves_its_result_as_it_is",
    "test_run_folder.py::test_a_damaged_file_that_cannot_be_rebuilt_is_one_line_and_the_folder_stays_as_it_is",
    "test_run_folder.py::test_the_fix_named_deleting_the_folder_takes_every_finished_phase_from_the_store",
    "test_sandbox.py::test_rollout_leaves_no_sandbox_behind",
    "test_scripts.py::test_every_shell_script_parses_and_every_python_script_answers_help",
    "test_sandbox.py::test_runner_killed_with_sigkill_leaves_no_sandbox_behind",
    "test_whale.py::test_a_rerun_with_other_settings_is_refused_with_one_line",
    "test_whale.py::test_a_run_interrupted_anywhere_resumes_to_the_same_result",
    "test_whale.py::test_a_search_under_weights_that_never_moved_is_copied_from_the_run_that_made_it",
    "test_whale.py::test_acceptance_is_strict_against_the_incoming_harness_re_scored_under_the_new_weights",
    "test_whale.py::test_adaptive_schedule_spends_the_same_budgets_and_each_harness_phase_adds_iterations",
    "test_whale.py::test_killed_run_resumes_without_redoing_work",
    "test_whale.py::test_methods_in_one_command_compute_shared_weight_phases_once_and_match_separate_runs",
}


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a whole run or an end-to-end CLI (deselect with -m 'not slow')")


def pytest_collection_modifyitems(items):
    for item in items:
        if f"{item.path.name}::{item.originalname}" in SLOW:  # whatever folder pytest started from
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def in_the_repo_root(monkeypatch):
    """The CLIs run from the repo root (harnesses/<domain>.py is their default): so does every test, whatever
    folder pytest was started from."""
    monkeypatch.chdir(ROOT)


@pytest.fixture(autouse=True)
def fresh_error_budget():
    """Each test starts a phase of rollout's error budget: one test's lost episodes never stop another's run."""
    rollout = sys.modules.get("rollout")  # not imported here: tests that never run episodes need not pay for it
    if rollout is not None:
        rollout.INFRA_ERRORS.start_phase("the test")


WEAK_BOUNDS_GIVEN = os.environ.get("WHALE_ALLOW_WEAK_BOUNDS")  # read once, before any test or fixture runs a CLI


@pytest.fixture(autouse=True)
def weak_bounds_switch_as_given(monkeypatch):
    """A CLI a test (or a module's fixture) runs in process sets WHALE_ALLOW_WEAK_BOUNDS for its process
    (sandbox.apply_args: `builtin` for a run whose proposer writes no code): each test starts with the value the
    suite started with."""
    name = "WHALE_ALLOW_WEAK_BOUNDS"
    if WEAK_BOUNDS_GIVEN is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, WEAK_BOUNDS_GIVEN)
