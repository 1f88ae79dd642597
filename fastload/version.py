"""The fastload release number, in one place (the package, the manifest, reports and the CLI read it)."""

__version__ = "0.1.0"
