"""Schemathesis hooks for the API contract run (run.sh sets SCHEMATHESIS_HOOKS=hooks)."""

import schemathesis

# Tar uploads are raw bytes, like application/octet-stream.
schemathesis.serializer.alias("application/x-tar", "application/octet-stream")
