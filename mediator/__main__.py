"""``python -m mediator``: the ``evamed`` command line."""

from mediator.cli import app

if __name__ == "__main__":
    app(prog_name="evamed")
