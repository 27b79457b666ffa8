"""The finders' shape (issue 44): a search inside the user's own process, started by a call there.

``autotune.find_batch_size`` decorates a training function (Accelerate's ``find_executable_batch_size``
shape); ``autotune.finder.lightning.AutotuneFinder`` is a Lightning callback (``BatchSizeFinder``'s shape)
and ``autotune.finder.hf.AutotuneCallback`` a Hugging Face Trainer callback. Each runs the search of
autotune.search with a runner that measures each configuration in this process
(autotune.finder.inprocess), then applies the answer: batch size, accumulation and recompute plan.
"""
