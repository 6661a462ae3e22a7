"""Settings every host test shares."""

from harness.envoy import scratch_dir


def pytest_configure(config):
    # pytest keeps its tmp_path folders across runs; a run here leaves
    # nothing in the temp dir, so they go where the run's own scratch goes.
    if not config.option.basetemp:
        config.option.basetemp = scratch_dir("grpc-wasm-pytest-")
