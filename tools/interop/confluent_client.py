"""Confluent's own Python client (confluent-kafka with its Avro and Protobuf serializers and
schema registry client) as the other side of weir's Avro and Protobuf connectors: it writes
events that weir must read, and reads what weir wrote (tests/kafka_formats.rs runs it).

    confluent_client.py produce BOOTSTRAP REGISTRY TOPIC avro|protobuf N
    confluent_client.py consume BOOTSTRAP REGISTRY TOPIC avro|protobuf N   # JSON lines out

The Protobuf message is the second one of event.proto beside this file (message indexes
[1]); its Python class is generated at run time with grpc_tools' protoc.
"""

import json
import os
import subprocess
import sys
import tempfile

from confluent_kafka import DeserializingConsumer, SerializingProducer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer

HERE = os.path.dirname(os.path.abspath(__file__))

AVRO = json.dumps({
    "type": "record", "name": "Event", "namespace": "weir",
    "fields": [{"name": n, "type": "long"} for n in ("key", "value", "time_ns", "seq")],
})


def event_class():
    # Generated into a temporary folder, imported, and the folder removed (nothing left in /tmp).
    with tempfile.TemporaryDirectory(prefix="weir-interop-") as out:
        subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{HERE}", f"--python_out={out}",
                        "event.proto"], check=True)
        sys.path.insert(0, out)
        import event_pb2  # noqa: E402
        sys.path.remove(out)
    return event_pb2.Event


def event(seq):
    return {"key": seq % 7, "value": seq * 3, "time_ns": 1_700_000_000_000_000_000 + seq, "seq": seq}


def main():
    mode, bootstrap, registry, topic, fmt, n = sys.argv[1:7]
    n = int(n)
    client = SchemaRegistryClient({"url": registry})
    if fmt == "avro":
        serializer = AvroSerializer(client, AVRO, lambda e, ctx: e)
        deserializer = AvroDeserializer(client, AVRO, lambda d, ctx: d)
    else:
        cls = event_class()
        serializer = ProtobufSerializer(cls, client, {"use.deprecated.format": False})
        deserializer = ProtobufDeserializer(cls, {"use.deprecated.format": False})
    if mode == "produce":
        producer = SerializingProducer({"bootstrap.servers": bootstrap, "value.serializer": serializer})
        for seq in range(n):
            e = event(seq)
            producer.produce(topic, value=e if fmt == "avro" else cls(**e))
        producer.flush(30)
        return
    consumer = DeserializingConsumer({"bootstrap.servers": bootstrap, "group.id": "interop",
                                      "auto.offset.reset": "earliest", "value.deserializer": deserializer})
    consumer.subscribe([topic])
    got = 0
    while got < n:
        m = consumer.poll(30)
        if m is None:
            sys.exit(f"only {got} of {n} records in 30 s")
        if m.error():
            continue
        v = m.value()
        if fmt != "avro":
            v = {f: getattr(v, f) for f in ("key", "value", "time_ns", "seq")}
        print(json.dumps(v), flush=True)
        got += 1
    consumer.close()


if __name__ == "__main__":
    main()
