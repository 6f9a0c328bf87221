"""The command implementations; `posenc_cli.cli` registers them with Typer."""
