"""Table maintenance run by the jobs themselves (:mod:`.scheduler`) and by ``timestone tables maintain``
(:mod:`.cli`), with one configuration section (:mod:`.config`); the operations are in
:mod:`sinks.maintenance`."""
