"""The EVA event mediator: the algebra (``mediator.eva``), the service and the ``evamed`` CLI."""
