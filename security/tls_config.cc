#include "security/tls_config.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace tandem {
namespace {

// The leaf (first) certificate of a PEM chain; nullptr when there is none.
std::unique_ptr<X509, decltype(&X509_free)> FirstCertificate(const std::string& pem) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_mem_buf(pem.data(), pem.size()), BIO_free);
  std::unique_ptr<X509, decltype(&X509_free)> cert(
      bio ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr, X509_free);
  ERR_clear_error();
  return cert;
}

std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> PrivateKey(const std::string& pem) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_mem_buf(pem.data(), pem.size()), BIO_free);
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
      bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr) : nullptr, EVP_PKEY_free);
  ERR_clear_error();
  return key;
}

// Reads the PEM file of `flag` and checks that it parses as what it should be: certificates
// (the first one not expired) or an unencrypted private key.
absl::StatusOr<std::string> ReadPem(const char* flag, const std::string& path, bool private_key) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--%s: cannot read %s: %s", flag, path, std::strerror(errno)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  std::string pem = text.str();
  if (private_key) {
    if (!PrivateKey(pem)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--%s: %s is not an unencrypted PEM private key", flag, path));
    }
    return pem;
  }
  auto cert = FirstCertificate(pem);
  if (!cert) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--%s: %s holds no PEM certificate", flag, path));
  }
  if (X509_cmp_current_time(X509_get0_notAfter(cert.get())) < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--%s: the certificate in %s has expired", flag, path));
  }
  return pem;
}

// Reads whichever of the three files are named.
absl::StatusOr<TlsConfig> ReadAll(const TlsFlags& flags) {
  TlsConfig c;
  c.enabled = flags.any();
  if (!flags.cert.empty()) {
    auto pem = ReadPem("tls-cert", flags.cert, /*private_key=*/false);
    if (!pem.ok()) return pem.status();
    c.cert_pem = std::move(*pem);
  }
  if (!flags.key.empty()) {
    auto pem = ReadPem("tls-key", flags.key, /*private_key=*/true);
    if (!pem.ok()) return pem.status();
    c.key_pem = std::move(*pem);
    if (X509_check_private_key(FirstCertificate(c.cert_pem).get(), PrivateKey(c.key_pem).get()) !=
        1) {
      ERR_clear_error();
      return absl::InvalidArgumentError(absl::StrFormat(
          "--tls-key: %s is not the private key of the certificate in --tls-cert %s", flags.key,
          flags.cert));
    }
  }
  if (!flags.ca.empty()) {
    auto pem = ReadPem("tls-ca", flags.ca, /*private_key=*/false);
    if (!pem.ok()) return pem.status();
    c.ca_pem = std::move(*pem);
  }
  return c;
}

absl::Status CheckPair(const TlsFlags& flags) {
  if (!flags.cert.empty() && flags.key.empty()) {
    return absl::InvalidArgumentError("--tls-key is required with --tls-cert");
  }
  if (flags.cert.empty() && !flags.key.empty()) {
    return absl::InvalidArgumentError("--tls-cert is required with --tls-key");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TlsConfig> LoadServerTls(const TlsFlags& flags) {
  if (absl::Status s = CheckPair(flags); !s.ok()) return s;
  if (!flags.ca.empty() && flags.cert.empty()) {
    return absl::InvalidArgumentError(
        "--tls-ca needs --tls-cert and --tls-key (mutual TLS: this server's own certificate)");
  }
  return ReadAll(flags);
}

absl::StatusOr<TlsConfig> LoadClientTls(const TlsFlags& flags) {
  if (absl::Status s = CheckPair(flags); !s.ok()) return s;
  return ReadAll(flags);
}

std::string RoleSet::ToString() const {
  std::vector<std::string> names;
  for (PeerRole r : {PeerRole::kRouter, PeerRole::kPrefill, PeerRole::kDecode}) {
    if (Has(r)) names.push_back(RoleName(r));
  }
  return names.empty() ? "none" : absl::StrJoin(names, ",");
}

const char* RoleName(PeerRole role) {
  switch (role) {
    case PeerRole::kRouter:
      return "router";
    case PeerRole::kPrefill:
      return "prefill";
    case PeerRole::kDecode:
      return "decode";
  }
  return "?";
}

std::string RoleUri(PeerRole role) { return std::string("urn:tandem:role:") + RoleName(role); }

RoleSet RoleOfUri(std::string_view uri) {
  for (PeerRole r : {PeerRole::kRouter, PeerRole::kPrefill, PeerRole::kDecode}) {
    if (uri == RoleUri(r)) return r;
  }
  return {};
}

RoleSet RolesOfCertificate(std::string_view cert_pem) {
  auto cert = FirstCertificate(std::string(cert_pem));
  if (!cert) return {};
  RoleSet roles;
  auto* names = static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(cert.get(), NID_subject_alt_name, nullptr, nullptr));
  if (names == nullptr) return roles;
  for (int i = 0; i < sk_GENERAL_NAME_num(names); ++i) {
    const GENERAL_NAME* n = sk_GENERAL_NAME_value(names, i);
    if (n->type != GEN_URI) continue;
    const ASN1_IA5STRING* s = n->d.uniformResourceIdentifier;
    roles = roles | RoleOfUri(std::string_view(reinterpret_cast<const char*>(s->data), s->length));
  }
  GENERAL_NAMES_free(names);
  return roles;
}

}  // namespace tandem
