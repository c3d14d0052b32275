"""The ClientApp: one device that trains the global model on its own data within its memory budget."""

from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from frugal import fl

from frugal_flower import task

def _budget(partition_id: int, mode: str):
    """The client's budget: its device class's (``classes``), none (``plain``), or the smallest plan
    the model has (``floor``: every client recomputing)."""
    if mode == "plain":
        return None
    if mode == "floor":
        return task.new_trainer().plan_info()["floor_bytes"]
    if mode != "classes":
        raise ValueError(f"budget-mode {mode!r} (classes, plain or floor)")
    return task.device_class(partition_id)[1]


def make_client_app(**overrides) -> ClientApp:
    """The ClientApp; ``overrides`` take precedence over the run config (``budget-mode``,
    ``local-epochs``): Flower's in-process ``run_simulation`` passes no run config."""
    app = ClientApp()

    def setting(context: Context, key: str):
        return overrides.get(key, context.run_config.get(key, task.DEFAULTS[key]))

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        n = int(context.node_config["num-partitions"])
        mode = str(setting(context, "budget-mode"))
        epochs = int(setting(context, "local-epochs"))
        rnd = int(msg.content["config"].get("server-round", 0))
        weights = fl.from_arrayrecord(msg.content["arrays"], template=task.initial_weights())
        new, metrics = task.train_client(weights, pid, n, _budget(pid, mode), epochs, seed=rnd)
        content = RecordDict({"arrays": fl.to_arrayrecord(new), "metrics": MetricRecord(metrics)})
        return Message(content=content, reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        weights = fl.from_arrayrecord(msg.content["arrays"], template=task.initial_weights())
        r = task.evaluate_global(weights)
        metrics = {"eval-loss": r["loss"], "eval-acc": r["accuracy"], "num-examples": 360}
        return Message(content=RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)

    return app


app = make_client_app()
