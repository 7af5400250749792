"""The EVA event mediator: the algebra (``eva``), the service and the ``evamed`` CLI."""
