"""Minimal repro scripts of what kvledger's attach found in SGLang's real components (spec/sglang-attach.md).

Each script imports only SGLang and torch, so a maintainer can run it against an unmodified install.
"""
