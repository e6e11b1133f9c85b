"""The Arrow Flight door of ``topicbase serve`` (bulk Arrow in and out; see ``server``)."""
