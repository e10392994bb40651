"""The models and model tools that the actors set up from the configuration, which need a provider
module and so cannot live in ``runtime/`` or in ``providers/`` (providers are wire protocols only:
docs/decisions.md#layout-forbidden-pairs): the built-in offline model and its demo tools
(:mod:`actors.models.builtin`), the scripted ``faux`` providers named by ``ai.providers.<alias>.script``
(:mod:`actors.models.faux_script`) and the ``generate_image`` tool (:mod:`actors.models.image_tool`).
Nothing here imports Ray.
"""

__all__: list[str] = []
