.PHONY: setup setup-demo test demo lint chaos chaos-admin bench headline
# Everything the tests and the benchmarks use.
setup:
	bash scripts/setup.sh
# Only what the demo needs (make demo runs it first).
setup-demo:
	bash scripts/setup.sh --demo
test:
	bash scripts/test.sh
demo:
	bash scripts/demo.sh
lint:
	.venv/bin/ruff check coordinator tests bench scripts stubs sim
	.venv/bin/mypy
# The long chaos run (about a minute per run): seeds 1-200, each judged by the oracle, each in the delivery layout
# its seed draws (one unit, named-only delivery, two placement groups); see docs/reliability.md.
chaos:
	.venv/bin/python -m tests.chaos --runs 200 --seed 1 --layout mixed --json docs/chaos-results.json --resume --workdir chaos-runs
# The same with the agents draining through the load balancer's admin state and ARM at its worst in the
# plan (about a minute per run): seeds 1-50; see docs/reliability.md.
chaos-admin:
	.venv/bin/python -m tests.chaos --runs 50 --seed 1 --admin-state --json docs/chaos-admin-results.json --resume --workdir chaos-runs-admin
# The benchmarks (about 40 minutes on 2 cores): bench/results.json and docs/benchmarks.md are rewritten.
bench:
	bash scripts/setup.sh
	.venv/bin/python bench/run.py
# The headline (about 35 minutes on 2 cores): one maintenance story under coordinated, admin-state,
# self-approve and wait, 5 times each; its section of docs/benchmarks.md is rewritten.
headline:
	bash scripts/setup.sh
	.venv/bin/python bench/run.py --only headline --headline-runs 5 --headline-time-scale 20
