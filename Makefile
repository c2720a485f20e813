.PHONY: setup test demo lint
setup:
	bash scripts/setup.sh
test:
	bash scripts/test.sh
demo:
	bash scripts/demo.sh
lint:
	.venv/bin/ruff check coordinator tests bench scripts
	.venv/bin/mypy
