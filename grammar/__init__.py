"""Topicbase's SQL grammar: text in, typed statement objects out.

Modules: ``grammar.parse`` (``parse``, ``parse_one``), ``grammar.split`` (positions,
``split_statements``, tokens, literal rows), ``grammar.ast`` (statement classes),
``grammar.settings`` (setting tables and checks) and ``topic.lark`` (the grammar).
Nothing is re-exported here, so ``grammar.parse`` always names the module.
"""
