"""Stack settings: the stack file read into typed settings, every problem named by key, value and what was expected; refusal of plain-text credentials."""
