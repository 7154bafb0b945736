"""Verification of committed files: whole-file and chunk checks, verify-on-read, scrub."""
