"""Tandem's gRPC API through a client generated from proto/ (pip install grpcio grpcio-tools):

    python -m grpc_tools.protoc -I proto --python_out=. --grpc_python_out=. \
        proto/tandem/v1/generation.proto
    python3 grpc_client.py HOST:PORT [API_KEY]

Streams a completion (the same request as openai_client.py's, so the same tokens), then scores
a text. The README shows this file; a test runs it against a real cluster
(tests/clients/python_clients_test.sh).
"""
import sys

import grpc
from tandem.v1 import generation_pb2 as pb
from tandem.v1 import generation_pb2_grpc as rpc


def main():
    address = sys.argv[1]
    metadata = [("authorization", f"Bearer {sys.argv[2]}")] if len(sys.argv) > 2 else []
    stub = rpc.GenerationStub(grpc.insecure_channel(address))  # grpc.secure_channel under TLS

    request = pb.GenerateRequest(text="The old lighthouse", max_tokens=24,
                                 sampling=pb.SamplingParams(temperature=0.8, seed=7))
    print("completion: ", end="")
    for response in stub.Generate(request, metadata=metadata, timeout=60):
        print(response.text, end="", flush=True)
        if response.finish_reason:
            print()
            print("finish:", pb.FinishReason.Name(response.finish_reason),
                  response.usage.completion_tokens, "tokens, TTFT",
                  f"{response.timings.ttft_seconds:.6f} s")

    score = stub.Score(pb.ScoreRequest(text="Once upon a time"), metadata=metadata, timeout=60)
    print("perplexity:", round(score.perplexity, 3))


if __name__ == "__main__":
    main()
