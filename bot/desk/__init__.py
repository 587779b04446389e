"""The operator desk: every action an operator may take, and who may take it."""
