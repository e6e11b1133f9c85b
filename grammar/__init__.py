"""Topicbase's SQL grammar: text in, typed statement objects out.

Modules: ``grammar.parse`` (``parse``, ``parse_one``: the front door, dispatching each
statement by its first words), ``grammar.tree_builder`` (topic statements through the Lark
grammar ``topic.lark``, built into objects), ``grammar.insert_topic`` (INSERT INTO TOPIC,
its literal-rows fast path), ``grammar.topic_scans`` (ordinary SQL and ``TOPIC name``
relations in it), ``grammar.names`` (topic and consumer names), ``grammar.split``
(positions, ``split_statements``, tokens, literal rows), ``grammar.ast`` (statement
classes) and ``grammar.settings`` (setting tables and checks).
Nothing is re-exported here, so ``grammar.parse`` always names the module.
"""
