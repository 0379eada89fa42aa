"""Fakes of the heavy services, for fast tests of what runs on top of them
(:mod:`tests.fakes.plane`)."""
