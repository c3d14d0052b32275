"""The ServerApp: FedAvg over the clients, the global model evaluated on the held-out digits every
round, and a JSON record of the run (per-round accuracy, every client's plan and arena against its
budget) written to the run config's ``results-path`` when it is set."""

import json

from flwr.app import ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

from frugal import fl

from frugal_flower import task

def make_server_app(**overrides) -> ServerApp:
    """The ServerApp; ``overrides`` take precedence over the run config (``num-server-rounds``,
    ``min-nodes``, ``results-path``): Flower's in-process ``run_simulation`` passes no run config."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        cfg = {**task.DEFAULTS, **context.run_config, **overrides}
        run(grid, cfg)

    return app


def run(grid: Grid, cfg: dict) -> None:
    """FedAvg for ``cfg["num-server-rounds"]`` rounds over ``cfg["min-nodes"]`` clients."""
    rounds = int(cfg["num-server-rounds"])
    nodes = int(cfg["min-nodes"])
    template = task.initial_weights()
    clients: list[dict] = []
    accuracy: list[dict] = []

    def train_metrics(records, key):
        rnd = len({c["round"] for c in clients}) + 1
        for r in records:
            for m in r.metric_records.values():
                clients.append(dict(m, round=rnd))
        return aggregate_metricrecords(records, key)

    def evaluate(server_round, arrays):
        r = task.evaluate_global(fl.from_arrayrecord(arrays, template=template))
        accuracy.append(dict(r, round=server_round))
        return MetricRecord(r)

    strategy = FedAvg(
        fraction_train=1.0,
        fraction_evaluate=0.0,
        min_train_nodes=nodes,
        min_available_nodes=nodes,
        train_metrics_aggr_fn=train_metrics,
    )
    result = strategy.start(
        grid=grid,
        initial_arrays=fl.to_arrayrecord(template),
        num_rounds=rounds,
        train_config=ConfigRecord({}),
        evaluate_fn=evaluate,
    )
    out = str(cfg.get("results-path", ""))
    if out:
        final = fl.from_arrayrecord(result.arrays, template=template)
        with open(out, "w") as f:
            json.dump(
                {
                    "rounds": rounds,
                    "nodes": nodes,
                    "accuracy": accuracy,
                    "clients": clients,
                    "weights": {k: v.ravel().tolist() for k, v in final.items()},
                },
                f,
            )


app = make_server_app()
