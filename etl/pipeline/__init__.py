"""The build: :class:`~etl.pipeline.context.BuildContext` (config, storage, key, zones of one run), the stage entry
points the DAGs call (:mod:`etl.pipeline.stages`: read -> pure functions -> write), the ledger, the build lock,
incremental resume and the publish stage."""
