"""(placeholder: filled by the issue that builds this command)."""
