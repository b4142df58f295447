#include "rpc/server_reflection.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>

#include <algorithm>
#include <set>
#include <utility>

namespace tandem {
namespace {

namespace pb = google::protobuf;
using grpc::reflection::v1::ServerReflectionRequest;
using grpc::reflection::v1::ServerReflectionResponse;

void SetError(grpc::StatusCode code, const std::string& message, ServerReflectionResponse* out) {
  out->mutable_error_response()->set_error_code(static_cast<int32_t>(code));
  out->mutable_error_response()->set_error_message(message);
}

// `file`, then the files it imports (transitively), each once per answer: a client that has the
// answer can build every type the file uses.
void AddFile(const pb::FileDescriptor* file, std::set<const pb::FileDescriptor*>* sent,
             ServerReflectionResponse* out) {
  if (!sent->insert(file).second) return;
  pb::FileDescriptorProto proto;
  file->CopyTo(&proto);
  proto.SerializeToString(out->mutable_file_descriptor_response()->add_file_descriptor_proto());
  for (int i = 0; i < file->dependency_count(); ++i) AddFile(file->dependency(i), sent, out);
}

}  // namespace

ServerReflectionV1::ServerReflectionV1(std::vector<std::string> services)
    : services_(std::move(services)) {}

ServerReflectionResponse ServerReflectionV1::Answer(const ServerReflectionRequest& request) const {
  const pb::DescriptorPool* pool = pb::DescriptorPool::generated_pool();
  ServerReflectionResponse out;
  out.set_valid_host(request.host());
  *out.mutable_original_request() = request;
  std::set<const pb::FileDescriptor*> sent;
  auto add_file = [&](const pb::FileDescriptor* file, const std::string& missing) {
    if (file == nullptr) return SetError(grpc::StatusCode::NOT_FOUND, missing, &out);
    AddFile(file, &sent, &out);
  };
  switch (request.message_request_case()) {
    case ServerReflectionRequest::kFileByFilename:
      add_file(pool->FindFileByName(request.file_by_filename()),
               "no file named " + request.file_by_filename());
      break;
    case ServerReflectionRequest::kFileContainingSymbol:
      add_file(pool->FindFileContainingSymbol(request.file_containing_symbol()),
               "no symbol " + request.file_containing_symbol());
      break;
    case ServerReflectionRequest::kFileContainingExtension: {
      const auto& e = request.file_containing_extension();
      const pb::Descriptor* type = pool->FindMessageTypeByName(e.containing_type());
      if (type == nullptr) {
        SetError(grpc::StatusCode::NOT_FOUND, "no message type " + e.containing_type(), &out);
        break;
      }
      const pb::FieldDescriptor* field = pool->FindExtensionByNumber(type, e.extension_number());
      add_file(
          field == nullptr ? nullptr : field->file(),
          "no extension " + std::to_string(e.extension_number()) + " of " + e.containing_type());
      break;
    }
    case ServerReflectionRequest::kAllExtensionNumbersOfType: {
      const pb::Descriptor* type =
          pool->FindMessageTypeByName(request.all_extension_numbers_of_type());
      if (type == nullptr) {
        SetError(grpc::StatusCode::NOT_FOUND,
                 "no message type " + request.all_extension_numbers_of_type(), &out);
        break;
      }
      std::vector<const pb::FieldDescriptor*> extensions;
      pool->FindAllExtensions(type, &extensions);
      auto* numbers = out.mutable_all_extension_numbers_response();
      numbers->set_base_type_name(type->full_name());
      for (const pb::FieldDescriptor* f : extensions) numbers->add_extension_number(f->number());
      break;
    }
    case ServerReflectionRequest::kListServices:
      for (const std::string& name : services_) {
        out.mutable_list_services_response()->add_service()->set_name(name);
      }
      break;
    case ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET:
      SetError(grpc::StatusCode::INVALID_ARGUMENT, "the request asks for nothing", &out);
      break;
  }
  return out;
}

void WithoutReflection::UpdatePlugins(
    std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) {
  std::erase_if(*plugins, [](const std::unique_ptr<grpc::ServerBuilderPlugin>& p) {
    return dynamic_cast<grpc::reflection::ProtoServerReflectionPlugin*>(p.get()) != nullptr;
  });
}

grpc::Status ServerReflectionV1::ServerReflectionInfo(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<ServerReflectionResponse, ServerReflectionRequest>* stream) {
  ServerReflectionRequest request;
  while (!context->IsCancelled() && stream->Read(&request)) {
    if (!stream->Write(Answer(request))) break;
  }
  return grpc::Status::OK;
}

}  // namespace tandem
