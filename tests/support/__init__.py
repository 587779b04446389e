"""Helpers the tests share (worlds, clocks, operators, fakes' plumbing). No test module
imports another test module; they import from here."""
