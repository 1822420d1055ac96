"""The fake engine package (see server.py): copied as an arm's source in pipeline tests."""
