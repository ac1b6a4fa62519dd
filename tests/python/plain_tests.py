"""Runs a test script's test_* functions (plain asserts): each one's PASS or FAIL with its
traceback, then "N passed, N failed"; the exit status 1 when any failed. For scripts that run
alone as well as under pytest (kernel_groups_test.py, ours_vs_torch_test.py)."""
import traceback


def run_tests(namespace):
    tests = [(n, f) for n, f in namespace.items() if n.startswith("test_") and callable(f)]
    failed = 0
    for name, fn in tests:
        try:
            fn()
            print(f"PASS {name}")
        except Exception:  # noqa: BLE001 (report every test)
            failed += 1
            print(f"FAIL {name}")
            traceback.print_exc()
    print(f"{len(tests) - failed} passed, {failed} failed")
    return 1 if failed else 0
