#!/usr/bin/env python3
"""A five-minute tour of Cairn with a plain Orisun gRPC client (Python grpcio).

It drives the seed scenario of Command Context Consistency: read a decision context with
GetLatestByCriteria, decide, append with SaveEventsV2 under the observation, and retry when
the context moved (ALREADY_EXISTS).

    pip install grpcio grpcio-tools
    python3 examples/tour.py            # against localhost:5005, admin/changeit

Options: --target host:port, --user, --password, --boundary.
"""

import argparse
import base64
import json
import os
import sys
import tempfile
import uuid

import grpc
from grpc_tools import protoc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_stubs():
    """Generates the Orisun stubs from proto/ (no system protoc needed)."""
    out = tempfile.mkdtemp(prefix="cairn-tour-")
    import grpc_tools

    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    for proto in ("orisun/eventstore.proto", "orisun/admin.proto"):
        rc = protoc.main(
            ["protoc", f"-I{ROOT}/proto", f"-I{include}", f"--python_out={out}", f"--grpc_python_out={out}", proto]
        )
        if rc != 0:
            sys.exit(f"protoc failed on {proto}")
    sys.path.insert(0, out)
    from orisun import eventstore_pb2, eventstore_pb2_grpc  # noqa: E402

    return eventstore_pb2, eventstore_pb2_grpc


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="localhost:5005")
    parser.add_argument("--user", default="admin")
    parser.add_argument("--password", default="changeit")
    parser.add_argument("--boundary", default="default")
    args = parser.parse_args()

    pb, rpc = load_stubs()
    basic = base64.b64encode(f"{args.user}:{args.password}".encode()).decode()
    auth = [("authorization", f"Basic {basic}")]
    store = rpc.EventStoreStub(grpc.insecure_channel(args.target))
    boundary = args.boundary
    account = f"acc-{uuid.uuid4().hex[:8]}"

    def criterion(**tags):
        return pb.Criterion(tags=[pb.Tag(key=k.replace("__", "."), value=v) for k, v in tags.items()])

    # The decision context of one account: its opening and every debit of it.
    context = [
        criterion(eventType="AccountOpened", accountId=account),
        criterion(eventType="MoneyDebited", scopes__accountOpenedId=account),
    ]

    def event(event_type, data):
        return pb.EventToSave(event_id=str(uuid.uuid4()), event_type=event_type, data=json.dumps(data))

    def read_context():
        resp = store.GetLatestByCriteria(
            pb.GetLatestByCriteriaRequest(boundary=boundary, criteria=context), metadata=auth
        )
        newest = max(
            (r.event for r in resp.results if r.HasField("event")),
            key=lambda e: (e.position.commit_position, e.position.prepare_position),
            default=None,
        )
        return newest, resp.context_position

    def pos(p):
        return f"({p.commit_position}, {p.prepare_position})"

    print(f"1. Open {account} with a balance of 100 (nothing may exist yet: observe (-1,-1))")
    none = pb.Position(commit_position=-1, prepare_position=-1)
    observation = pb.ConsistencyObservation(query=pb.Query(criteria=context), position=none)
    r = store.SaveEventsV2(
        pb.SaveEventsV2Request(
            boundary=boundary,
            events=[event("AccountOpened", {"accountId": account, "balance": 100})],
            consistency=[observation],
        ),
        metadata=auth,
    )
    print(f"   committed at {pos(r.log_position)}, write_id {r.write_id}")

    print("2. Read the context, decide a debit of 30, append under the observation")
    newest, seen = read_context()
    balance = json.loads(newest.data)["balance"]
    print(f"   balance {balance}, context position {pos(seen)}")
    stale_observation = pb.ConsistencyObservation(query=pb.Query(criteria=context), position=seen)
    debit = {"scopes.accountOpenedId": account, "amount": 30, "balance": balance - 30}
    r = store.SaveEventsV2(
        pb.SaveEventsV2Request(
            boundary=boundary, events=[event("MoneyDebited", debit)], consistency=[stale_observation]
        ),
        metadata=auth,
    )
    print(f"   committed at {pos(r.log_position)}")

    print("3. A second decision made from the same (now stale) read is refused")
    try:
        store.SaveEventsV2(
            pb.SaveEventsV2Request(
                boundary=boundary, events=[event("MoneyDebited", debit)], consistency=[stale_observation]
            ),
            metadata=auth,
        )
        sys.exit("   unexpected: the stale write committed")
    except grpc.RpcError as e:
        print(f"   {e.code().name}: {e.details()}")

    print("4. Retry loop: re-read, re-decide, append; repeat on ALREADY_EXISTS")
    while True:
        newest, seen = read_context()
        balance = json.loads(newest.data)["balance"]
        if balance < 30:
            print("   refused: insufficient funds")
            break
        obs = pb.ConsistencyObservation(query=pb.Query(criteria=context), position=seen)
        debit = {"scopes.accountOpenedId": account, "amount": 30, "balance": balance - 30}
        try:
            r = store.SaveEventsV2(
                pb.SaveEventsV2Request(boundary=boundary, events=[event("MoneyDebited", debit)], consistency=[obs]),
                metadata=auth,
            )
            print(f"   balance {balance} -> {balance - 30}, committed at {pos(r.log_position)}")
            break
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.ALREADY_EXISTS:
                raise
            print("   context moved; retrying")

    print("5. The account's history (GetEvents with the context as a query)")
    events = store.GetEvents(
        pb.GetEventsRequest(boundary=boundary, query=pb.Query(criteria=context), count=100), metadata=auth
    ).events
    for e in events:
        print(f"   {pos(e.position)} {e.event_type:14} {e.data}")

    print("6. What the last write observed (GetWriteContext)")
    ctx = store.GetWriteContext(pb.GetWriteContextRequest(boundary=boundary, write_id=r.write_id), metadata=auth)
    for o in ctx.consistency:
        tags = [" & ".join(f"{t.key}={t.value}" for t in c.tags) for c in o.query.criteria]
        print(f"   {' | '.join(tags)} at {pos(o.position)}")


if __name__ == "__main__":
    main()
