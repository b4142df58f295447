// Server reflection v1 (rpc/server_reflection.h) beside gRPC's v1alpha plugin, as the router's
// public port serves them, on an in-process server: a v1 client lists the services and gets
// every descriptor a client needs to call tandem.v1.Generation (the answer builds the service in
// a pool of its own); v1alpha, asked the same over the same wire messages, answers the same;
// unknown names are NOT_FOUND. And on a real router: v1 on the public port only.
#include "rpc/server_reflection.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"
#include "tandem/v1/generation.grpc.pb.h"
#include "tests/serving/cluster.h"

namespace tandem {
namespace {

namespace pb = google::protobuf;
using grpc::reflection::v1::ServerReflectionRequest;
using grpc::reflection::v1::ServerReflectionResponse;

constexpr char kV1[] = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo";
constexpr char kV1Alpha[] = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";

// The answers to `requests` on one stream of `method` (v1's or v1alpha's: the same messages).
std::vector<ServerReflectionResponse> Ask(const std::shared_ptr<grpc::Channel>& channel,
                                          const std::string& method,
                                          const std::vector<ServerReflectionRequest>& requests,
                                          grpc::Status* status = nullptr) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  std::unique_ptr<grpc::ClientReaderWriter<ServerReflectionRequest, ServerReflectionResponse>>
      stream(
          grpc::internal::
              ClientReaderWriterFactory<ServerReflectionRequest, ServerReflectionResponse>::Create(
                  channel.get(),
                  grpc::internal::RpcMethod(method.c_str(),
                                            grpc::internal::RpcMethod::BIDI_STREAMING, channel),
                  &ctx));
  std::vector<ServerReflectionResponse> answers;
  for (const ServerReflectionRequest& r : requests) {
    if (!stream->Write(r)) break;
    ServerReflectionResponse answer;
    if (!stream->Read(&answer)) break;
    answers.push_back(std::move(answer));
  }
  stream->WritesDone();
  const grpc::Status s = stream->Finish();
  if (status != nullptr) *status = s;
  return answers;
}

class ServerReflectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&generation_);
    builder.RegisterService(&reflection_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                   grpc::InsecureChannelCredentials());
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  int port_ = 0;
  tandem::v1::Generation::Service generation_;  // every method UNIMPLEMENTED: only described
  ServerReflectionV1 reflection_{{tandem::v1::Generation::service_full_name(),
                                  grpc::health::v1::Health::service_full_name(),
                                  "grpc.reflection.v1alpha.ServerReflection",
                                  grpc::reflection::v1::ServerReflection::service_full_name()}};
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

ServerReflectionRequest ListServices() {
  ServerReflectionRequest r;
  r.set_host("localhost");
  r.set_list_services("");
  return r;
}

ServerReflectionRequest Symbol(const std::string& name) {
  ServerReflectionRequest r;
  r.set_file_containing_symbol(name);
  return r;
}

std::set<std::string> Services(const ServerReflectionResponse& r) {
  std::set<std::string> names;
  for (const auto& s : r.list_services_response().service()) names.insert(s.name());
  return names;
}

std::set<std::string> FileNames(const ServerReflectionResponse& r) {
  std::set<std::string> names;
  for (const std::string& bytes : r.file_descriptor_response().file_descriptor_proto()) {
    pb::FileDescriptorProto file;
    EXPECT_TRUE(file.ParseFromString(bytes));
    names.insert(file.name());
  }
  return names;
}

TEST_F(ServerReflectionTest, V1ClientListsAndDescribesTheServices) {
  // Through the generated v1 stub, as a v1 client calls it.
  auto stub = grpc::reflection::v1::ServerReflection::NewStub(channel_);
  grpc::ClientContext ctx;
  auto stream = stub->ServerReflectionInfo(&ctx);
  ASSERT_TRUE(stream->Write(ListServices()));
  ServerReflectionResponse list;
  ASSERT_TRUE(stream->Read(&list));
  EXPECT_EQ(list.valid_host(), "localhost");
  EXPECT_TRUE(list.original_request().has_list_services());
  EXPECT_EQ(Services(list), (std::set<std::string>{"tandem.v1.Generation", "grpc.health.v1.Health",
                                                   "grpc.reflection.v1alpha.ServerReflection",
                                                   "grpc.reflection.v1.ServerReflection"}));
  ASSERT_TRUE(stream->Write(Symbol("tandem.v1.Generation")));
  ServerReflectionResponse files;
  ASSERT_TRUE(stream->Read(&files));
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  ASSERT_TRUE(files.has_file_descriptor_response()) << files.DebugString();

  // The answer alone describes the service: a pool of its own builds it, imports included.
  pb::DescriptorPool pool;
  std::vector<pb::FileDescriptorProto> protos;
  for (const std::string& bytes : files.file_descriptor_response().file_descriptor_proto()) {
    ASSERT_TRUE(protos.emplace_back().ParseFromString(bytes));
  }
  EXPECT_EQ(protos.front().name(), "tandem/v1/generation.proto");
  // Imports first, as a client builds them.
  for (auto it = protos.rbegin(); it != protos.rend(); ++it) {
    ASSERT_NE(pool.BuildFile(*it), nullptr) << it->name();
  }
  const pb::ServiceDescriptor* service = pool.FindServiceByName("tandem.v1.Generation");
  ASSERT_NE(service, nullptr);
  const pb::MethodDescriptor* generate = service->FindMethodByName("Generate");
  ASSERT_NE(generate, nullptr);
  EXPECT_TRUE(generate->server_streaming());
  EXPECT_EQ(generate->input_type()->full_name(), "tandem.v1.GenerateRequest");
  EXPECT_NE(pool.FindMessageTypeByName("tandem.v1.SamplingParams"), nullptr);
}

// Every kind of request, on v1 and on v1alpha: the same answers (v1alpha's services are v1's
// but v1 itself, which gRPC's plugin does not know).
TEST_F(ServerReflectionTest, V1AnswersAsV1AlphaDoes) {
  std::vector<ServerReflectionRequest> requests = {
      ListServices(), Symbol("tandem.v1.Generation"), Symbol("tandem.v1.GenerateRequest"),
      Symbol("tandem.v1.Generation.Score"), Symbol("grpc.health.v1.Health")};
  ServerReflectionRequest by_name;
  by_name.set_file_by_filename("tandem/v1/generation.proto");
  requests.push_back(by_name);
  ServerReflectionRequest extensions;
  extensions.set_all_extension_numbers_of_type("tandem.v1.GenerateRequest");
  requests.push_back(extensions);
  for (const char* missing : {"tandem.v1.Nothing", "tandem.v1.Generation.Nothing"}) {
    requests.push_back(Symbol(missing));
  }
  ServerReflectionRequest no_file;
  no_file.set_file_by_filename("nothing.proto");
  requests.push_back(no_file);
  ServerReflectionRequest no_extension;
  no_extension.mutable_file_containing_extension()->set_containing_type(
      "tandem.v1.GenerateRequest");
  no_extension.mutable_file_containing_extension()->set_extension_number(100);
  requests.push_back(no_extension);
  ServerReflectionRequest no_type;
  no_type.set_all_extension_numbers_of_type("tandem.v1.Nothing");
  requests.push_back(no_type);

  grpc::Status v1_status, alpha_status;
  const auto v1 = Ask(channel_, kV1, requests, &v1_status);
  const auto alpha = Ask(channel_, kV1Alpha, requests, &alpha_status);
  ASSERT_TRUE(v1_status.ok()) << v1_status.error_message();
  ASSERT_TRUE(alpha_status.ok()) << alpha_status.error_message();
  ASSERT_EQ(v1.size(), requests.size());
  ASSERT_EQ(alpha.size(), requests.size());
  std::set<std::string> alpha_services = Services(alpha[0]);
  alpha_services.insert("grpc.reflection.v1.ServerReflection");
  EXPECT_EQ(Services(v1[0]), alpha_services);
  for (size_t i = 1; i < requests.size(); ++i) {
    SCOPED_TRACE(requests[i].ShortDebugString());
    EXPECT_EQ(v1[i].message_response_case(), alpha[i].message_response_case());
    EXPECT_EQ(v1[i].original_request().ShortDebugString(), requests[i].ShortDebugString());
    EXPECT_EQ(FileNames(v1[i]), FileNames(alpha[i]));
    EXPECT_EQ(v1[i].all_extension_numbers_response().ShortDebugString(),
              alpha[i].all_extension_numbers_response().ShortDebugString());
    EXPECT_EQ(v1[i].error_response().error_code(), alpha[i].error_response().error_code());
  }
  EXPECT_FALSE(FileNames(v1[1]).empty());
  EXPECT_EQ(v1[6].all_extension_numbers_response().base_type_name(), "tandem.v1.GenerateRequest");
  for (size_t i = 7; i < requests.size(); ++i) {
    EXPECT_EQ(v1[i].error_response().error_code(), grpc::StatusCode::NOT_FOUND)
        << requests[i].ShortDebugString();
  }
  // A request that asks for nothing.
  const ServerReflectionResponse empty = reflection_.Answer(ServerReflectionRequest());
  EXPECT_EQ(empty.error_response().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// A real cluster: the router's public port answers v1 as v1alpha, and lists the public services;
// the internal ports (the router's registry, each worker's) describe nothing, in either version.
TEST(ServerReflectionClusterTest, RouterPublicPortOnly) {
  testing::Cluster c(1, 1);
  ASSERT_TRUE(c.ready());
  const auto pub = grpc::CreateChannel(c.router(), grpc::InsecureChannelCredentials());
  const std::vector<ServerReflectionRequest> requests = {ListServices(),
                                                         Symbol("tandem.v1.Generation")};
  grpc::Status v1_status, alpha_status;
  const auto v1 = Ask(pub, kV1, requests, &v1_status);
  const auto alpha = Ask(pub, kV1Alpha, requests, &alpha_status);
  ASSERT_TRUE(v1_status.ok()) << v1_status.error_message();
  ASSERT_TRUE(alpha_status.ok()) << alpha_status.error_message();
  ASSERT_EQ(v1.size(), 2u);
  ASSERT_EQ(alpha.size(), 2u);
  const std::set<std::string> services = Services(v1[0]);
  EXPECT_TRUE(services.count("tandem.v1.Generation")) << v1[0].DebugString();
  EXPECT_TRUE(services.count("grpc.reflection.v1.ServerReflection")) << v1[0].DebugString();
  std::set<std::string> alpha_services = Services(alpha[0]);
  alpha_services.insert("grpc.reflection.v1.ServerReflection");
  EXPECT_EQ(services, alpha_services);
  EXPECT_FALSE(FileNames(v1[1]).empty());
  EXPECT_EQ(FileNames(v1[1]), FileNames(alpha[1]));
  std::vector<std::string> internal_ports = c.workers();
  internal_ports.push_back(c.router_internal());
  ASSERT_EQ(internal_ports.size(), 3u);
  for (const std::string& address : internal_ports) {
    const auto internal = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
    for (const char* method : {kV1, kV1Alpha}) {
      grpc::Status s;
      EXPECT_TRUE(Ask(internal, method, requests, &s).empty()) << address << method;
      EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED)
          << address << method << s.error_message();
    }
  }
}

}  // namespace
}  // namespace tandem
