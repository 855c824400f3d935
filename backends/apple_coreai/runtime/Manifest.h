/*
 * The Core AI delegate payload: a JSON manifest, read as untrusted input.
 *
 * Written by preprocess, version 2 as upstream's exporter writes it, plus
 * our initial_state field:
 *   {"packaging": "inline" | "sidecar" | "aot_compiled_inline" | "aot_compiled_sidecar",
 *    "hash": "<lowercase hex>", "path": "<hash>/model.aimodel", "version": 2,
 *    "function": "main"  (or, with enumerated shapes, "functions": [{"name": ...}, ...]),
 *    "input_names": [...], "output_names": [...],       (graph order, state included)
 *    "min_deployment_version": null | "27.0",
 *    "files": {"model.aimodel/main.mlirb": <bytes>, ...},
 *    "bundle_digests": {"model.aimodel": "<64 lowercase hex>"},
 *    "initial_state": {"<state>": {"file": "initial_state/...", "sha256": "<hex>",
 *                                  "dtype": "float32", "shape": [...]}}}
 *
 * The rules are upstream's on-device parse_manifest (executorch main,
 * coreai_assets.mm), except that sidecar packaging and enumerated functions
 * are accepted: this runtime runs both.  Every size is bounded and every
 * path is checked to stay inside <hash>/ before anything is allocated or
 * opened.
 */
#pragma once

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace executorch {
namespace backends {
namespace coreai_host {

constexpr size_t kMaxManifestBytes = 1 << 20;
constexpr size_t kMaxFiles = 1 << 16;
constexpr size_t kMaxPathBytes = 4096;
constexpr int kMaxJsonDepth = 16;

struct JsonValue {
  enum class Kind { Null, Bool, Number, String, Array, Object } kind = Kind::Null;
  bool boolean = false;
  double number = 0;
  bool integral = false;  // a number written without fraction or exponent, within int64
  int64_t integer = 0;
  std::string string;
  std::vector<JsonValue> array;
  std::vector<std::pair<std::string, JsonValue>> object;

  const JsonValue* get(const std::string& key) const {
    for (const auto& entry : object) {
      if (entry.first == key) {
        return &entry.second;
      }
    }
    return nullptr;
  }
};

// A small strict JSON reader (RFC 8259 subset: no duplicate-key semantics,
// \u escapes limited to the BMP).  Returns false with a message on any error.
class JsonReader {
 public:
  JsonReader(const char* data, size_t size) : p_(data), end_(data + size) {}

  bool read(JsonValue* out, std::string* error) {
    if (!value(out, 0)) {
      *error = error_ + " at byte " + std::to_string(offset());
      return false;
    }
    skip_space();
    if (p_ != end_) {
      *error = "trailing bytes after the manifest at byte " + std::to_string(offset());
      return false;
    }
    return true;
  }

 private:
  const char* p_;
  const char* const end_;
  const char* begin_ = p_;
  std::string error_;

  size_t offset() const { return static_cast<size_t>(p_ - begin_); }
  bool fail(const char* message) {
    error_ = message;
    return false;
  }
  void skip_space() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) {
      ++p_;
    }
  }
  bool literal(const char* word) {
    for (const char* w = word; *w; ++w, ++p_) {
      if (p_ >= end_ || *p_ != *w) {
        return fail("invalid literal");
      }
    }
    return true;
  }

  bool value(JsonValue* out, int depth) {
    if (depth > kMaxJsonDepth) {
      return fail("nesting too deep");
    }
    skip_space();
    if (p_ >= end_) {
      return fail("truncated");
    }
    switch (*p_) {
      case '{':
        return object(out, depth);
      case '[':
        return array(out, depth);
      case '"':
        out->kind = JsonValue::Kind::String;
        return string(&out->string);
      case 't':
        out->kind = JsonValue::Kind::Bool;
        out->boolean = true;
        return literal("true");
      case 'f':
        out->kind = JsonValue::Kind::Bool;
        return literal("false");
      case 'n':
        out->kind = JsonValue::Kind::Null;
        return literal("null");
      default:
        out->kind = JsonValue::Kind::Number;
        return number(out);
    }
  }

  bool object(JsonValue* out, int depth) {
    out->kind = JsonValue::Kind::Object;
    ++p_;
    skip_space();
    if (p_ < end_ && *p_ == '}') {
      ++p_;
      return true;
    }
    while (true) {
      skip_space();
      std::string key;
      if (p_ >= end_ || *p_ != '"' || !string(&key)) {
        return fail("expected a string key");
      }
      skip_space();
      if (p_ >= end_ || *p_ != ':') {
        return fail("expected ':'");
      }
      ++p_;
      out->object.emplace_back(std::move(key), JsonValue());
      if (!value(&out->object.back().second, depth + 1)) {
        return false;
      }
      skip_space();
      if (p_ < end_ && *p_ == ',') {
        ++p_;
        continue;
      }
      if (p_ < end_ && *p_ == '}') {
        ++p_;
        return true;
      }
      return fail("expected ',' or '}'");
    }
  }

  bool array(JsonValue* out, int depth) {
    out->kind = JsonValue::Kind::Array;
    ++p_;
    skip_space();
    if (p_ < end_ && *p_ == ']') {
      ++p_;
      return true;
    }
    while (true) {
      if (out->array.size() >= kMaxFiles) {
        return fail("array too long");
      }
      out->array.emplace_back();
      if (!value(&out->array.back(), depth + 1)) {
        return false;
      }
      skip_space();
      if (p_ < end_ && *p_ == ',') {
        ++p_;
        continue;
      }
      if (p_ < end_ && *p_ == ']') {
        ++p_;
        return true;
      }
      return fail("expected ',' or ']'");
    }
  }

  bool string(std::string* out) {
    ++p_;  // opening quote
    while (p_ < end_ && *p_ != '"') {
      unsigned char c = static_cast<unsigned char>(*p_++);
      if (c < 0x20) {
        return fail("control character in string");
      }
      if (c != '\\') {
        out->push_back(static_cast<char>(c));
        continue;
      }
      if (p_ >= end_) {
        return fail("truncated escape");
      }
      char e = *p_++;
      switch (e) {
        case '"': case '\\': case '/': out->push_back(e); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'n': out->push_back('\n'); break;
        case 'r': out->push_back('\r'); break;
        case 't': out->push_back('\t'); break;
        case 'u': {
          if (end_ - p_ < 4) {
            return fail("truncated \\u escape");
          }
          unsigned code = 0;
          for (int i = 0; i < 4; ++i) {
            char h = *p_++;
            code <<= 4;
            if (h >= '0' && h <= '9') code |= h - '0';
            else if (h >= 'a' && h <= 'f') code |= h - 'a' + 10;
            else if (h >= 'A' && h <= 'F') code |= h - 'A' + 10;
            else return fail("bad \\u escape");
          }
          if (code == 0) {
            return fail("NUL in string");
          }
          if (code < 0x80) {
            out->push_back(static_cast<char>(code));
          } else if (code < 0x800) {
            out->push_back(static_cast<char>(0xC0 | (code >> 6)));
            out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
          } else {
            out->push_back(static_cast<char>(0xE0 | (code >> 12)));
            out->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
            out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
          }
          break;
        }
        default:
          return fail("bad escape");
      }
      if (out->size() > kMaxPathBytes * 4) {
        return fail("string too long");
      }
    }
    if (p_ >= end_) {
      return fail("unterminated string");
    }
    ++p_;
    return true;
  }

  bool number(JsonValue* out) {
    const char* start = p_;
    while (p_ < end_ && (std::isdigit(static_cast<unsigned char>(*p_)) || *p_ == '-' ||
                         *p_ == '+' || *p_ == '.' || *p_ == 'e' || *p_ == 'E')) {
      ++p_;
    }
    if (p_ == start || p_ - start > 32) {
      return fail("expected a value");
    }
    std::string text(start, p_);
    char* parsed_end = nullptr;
    out->number = std::strtod(text.c_str(), &parsed_end);
    if (parsed_end != text.c_str() + text.size()) {
      return fail("bad number");
    }
    if (text.find_first_of(".eE") == std::string::npos) {
      errno = 0;
      out->integer = std::strtoll(text.c_str(), &parsed_end, 10);
      out->integral = errno == 0 && parsed_end == text.c_str() + text.size();
    }
    return true;
  }
};

// A path inside an asset: relative, '/'-separated, no empty, '.' or '..'
// component, no backslash or NUL.
inline bool is_contained_relative_path(const std::string& path) {
  if (path.empty() || path.size() > kMaxPathBytes || path[0] == '/') {
    return false;
  }
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    if (slash == std::string::npos) {
      slash = path.size();
    }
    std::string part = path.substr(start, slash - start);
    if (part.empty() || part == "." || part == ".." ||
        part.find('\\') != std::string::npos || part.find('\0') != std::string::npos) {
      return false;
    }
    start = slash + 1;
  }
  return true;
}

inline bool is_lower_hex(const std::string& text) {
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
      return false;
    }
  }
  return !text.empty();
}

// Upstream's min_deployment_version: null, or "N[.N[.N]]" with 1 to 6 digits a part and N > 0 first.
inline bool is_deployment_version(const JsonValue& value) {
  if (value.kind == JsonValue::Kind::Null) {
    return true;
  }
  if (value.kind != JsonValue::Kind::String || value.string.empty()) {
    return false;
  }
  size_t parts = 0, digits = 0;
  bool major_positive = false;
  for (char c : value.string + ".") {
    if (c == '.') {
      if (digits == 0 || digits > 6 || ++parts > 3) {
        return false;
      }
      digits = 0;
    } else if (c >= '0' && c <= '9') {
      ++digits;
      major_positive = major_positive || (parts == 0 && c != '0');
    } else {
      return false;
    }
  }
  return major_positive;
}

inline bool is_name_list(const JsonValue* value, std::vector<std::string>* out) {
  if (value == nullptr || value->kind != JsonValue::Kind::Array) {
    return false;
  }
  for (const JsonValue& name : value->array) {
    if (name.kind != JsonValue::Kind::String || name.string.empty()) {
      return false;
    }
    for (const std::string& seen : *out) {
      if (seen == name.string) {
        return false;
      }
    }
    out->push_back(name.string);
  }
  return true;
}

struct InitialState {
  std::string name;
  std::string file;  // under <hash>/, outside the bundle
  std::string sha256;
  std::string dtype;
  std::vector<int64_t> shape;
};

struct AssetFile {
  std::string path;  // under <hash>/, inside the bundle
  uint64_t size = 0;
};

constexpr int64_t kManifestVersion = 2;
constexpr const char* kSourceBundle = "model.aimodel";

struct Manifest {
  std::string packaging;
  std::string hash;
  std::string path;                       // "<hash>/model.aimodel"
  std::string function;                   // "" when the asset has enumerated functions
  std::vector<std::string> input_names;   // graph order, state arguments included
  std::vector<std::string> output_names;  // graph order, state tokens included
  std::vector<AssetFile> files;           // every file of the bundle
  std::string bundle_digest;              // bundle_digests["model.aimodel"]
  std::vector<InitialState> initial_state;

  bool is_aot_compiled() const { return packaging.rfind("aot_compiled", 0) == 0; }
  bool is_inline() const { return packaging == "inline"; }
  // The bundle's path under <hash>/.
  std::string bundle() const { return path.substr(hash.size() + 1); }
};

constexpr int64_t kMaxStateDim = int64_t(1) << 40;

// Upstream's validate_files: sizes of files inside the one declared bundle, none a parent of another.
inline bool parse_files(const JsonValue* files, Manifest* out, std::string* error) {
  if (files == nullptr || files->kind != JsonValue::Kind::Object || files->object.empty()) {
    *error = "manifest requires asset file sizes ('files')";
    return false;
  }
  const std::string prefix = std::string(kSourceBundle) + "/";
  for (const auto& entry : files->object) {
    const std::string& path = entry.first;
    const JsonValue& size = entry.second;
    if (!is_contained_relative_path(path) || path.rfind(prefix, 0) != 0 || size.kind != JsonValue::Kind::Number ||
        !size.integral || size.integer < 0) {
      *error = "invalid asset path or size for '" + path + "'";
      return false;
    }
    for (const AssetFile& seen : out->files) {
      const std::string& a = seen.path.size() < path.size() ? seen.path : path;
      const std::string& b = seen.path.size() < path.size() ? path : seen.path;
      if (a == b || (b.compare(0, a.size(), a) == 0 && b[a.size()] == '/')) {
        *error = "conflicting asset paths '" + seen.path + "' and '" + path + "'";
        return false;
      }
    }
    out->files.push_back({path, static_cast<uint64_t>(size.integer)});
  }
  return true;
}

inline bool parse_initial_state(const JsonValue* states, Manifest* out, std::string* error) {
  if (states == nullptr || states->kind == JsonValue::Kind::Null) {
    return true;
  }
  if (states->kind != JsonValue::Kind::Object) {
    *error = "'initial_state' is not an object";
    return false;
  }
  for (const auto& entry : states->object) {
    InitialState state;
    state.name = entry.first;
    const JsonValue* file = entry.second.get("file");
    const JsonValue* sha256 = entry.second.get("sha256");
    const JsonValue* dtype = entry.second.get("dtype");
    const JsonValue* shape = entry.second.get("shape");
    if (file == nullptr || file->kind != JsonValue::Kind::String || !is_contained_relative_path(file->string) ||
        sha256 == nullptr || sha256->kind != JsonValue::Kind::String || sha256->string.size() != 64 ||
        !is_lower_hex(sha256->string) || dtype == nullptr || dtype->kind != JsonValue::Kind::String ||
        shape == nullptr || shape->kind != JsonValue::Kind::Array || shape->array.size() > 16) {
      *error = "initial_state entry '" + state.name +
          "' needs a contained 'file', its 'sha256', a 'dtype' and a 'shape' of rank <= 16";
      return false;
    }
    state.file = file->string;
    state.sha256 = sha256->string;
    state.dtype = dtype->string;
    for (const JsonValue& dim : shape->array) {
      if (dim.kind != JsonValue::Kind::Number || !dim.integral || dim.integer < 0 || dim.integer > kMaxStateDim) {
        *error = "initial_state entry '" + state.name + "' has a dimension out of bounds";
        return false;
      }
      state.shape.push_back(dim.integer);
    }
    out->initial_state.push_back(std::move(state));
  }
  return true;
}

// Parses and validates a manifest.  On failure, *error says what is wrong.
inline bool parse_manifest(const void* data, size_t size, Manifest* out, std::string* error) {
  if (size == 0 || size > kMaxManifestBytes) {
    *error = "manifest of " + std::to_string(size) + " bytes (expected 1 to " +
        std::to_string(kMaxManifestBytes) + ")";
    return false;
  }
  JsonValue root;
  if (!JsonReader(static_cast<const char*>(data), size).read(&root, error)) {
    *error = "manifest is not valid JSON: " + *error;
    return false;
  }
  if (root.kind != JsonValue::Kind::Object) {
    *error = "manifest is not a JSON object";
    return false;
  }
  auto string_field = [&](const char* key, std::string* value) {
    const JsonValue* field = root.get(key);
    if (field == nullptr || field->kind != JsonValue::Kind::String) {
      *error = std::string("manifest has no string field '") + key + "'";
      return false;
    }
    *value = field->string;
    return true;
  };
  if (!string_field("packaging", &out->packaging) || !string_field("hash", &out->hash)) {
    return false;
  }
  if (!is_lower_hex(out->hash) || out->hash.size() > 128) {
    *error = "manifest hash is not a lowercase hex digest";
    return false;
  }
  const char* known[] = {"inline", "sidecar", "aot_compiled_inline", "aot_compiled_sidecar"};
  bool is_known = false;
  for (const char* k : known) {
    is_known = is_known || out->packaging == k;
  }
  if (!is_known) {
    *error = "unknown packaging '" + out->packaging + "'";
    return false;
  }
  if (out->is_aot_compiled()) {
    return true;  // the caller refuses it with its own message
  }
  const JsonValue* version = root.get("version");
  if (version == nullptr || version->kind != JsonValue::Kind::Number || !version->integral ||
      version->integer != kManifestVersion) {
    *error = "manifest is not version 2 (it has no ordered I/O names, file sizes or bundle digest); "
        "it was written by an older exporter";
    return false;
  }
  if (!string_field("path", &out->path)) {
    return false;
  }
  if (out->path != out->hash + "/" + kSourceBundle) {
    *error = "asset path '" + out->path + "' is not '<hash>/model.aimodel'";
    return false;
  }
  const JsonValue* function = root.get("function");
  const JsonValue* functions = root.get("functions");
  if (function != nullptr && function->kind == JsonValue::Kind::String && !function->string.empty()) {
    out->function = function->string;
  } else if (function != nullptr || functions == nullptr || functions->kind != JsonValue::Kind::Array ||
             functions->array.empty()) {
    *error = "manifest names no function ('function', or 'functions' for enumerated shapes)";
    return false;
  }
  if (!is_name_list(root.get("input_names"), &out->input_names) ||
      !is_name_list(root.get("output_names"), &out->output_names)) {
    *error = "manifest requires ordered input/output names (unique, non-empty)";
    return false;
  }
  const JsonValue* minimum = root.get("min_deployment_version");
  if (minimum == nullptr || !is_deployment_version(*minimum)) {
    *error = "invalid minimum deployment version (null or \"N[.N[.N]]\")";
    return false;
  }
  if (!parse_files(root.get("files"), out, error)) {
    return false;
  }
  const JsonValue* digests = root.get("bundle_digests");
  const JsonValue* digest = digests != nullptr && digests->kind == JsonValue::Kind::Object &&
          digests->object.size() == 1
      ? digests->get(kSourceBundle)
      : nullptr;
  if (digest == nullptr || digest->kind != JsonValue::Kind::String || digest->string.size() != 64 ||
      !is_lower_hex(digest->string)) {
    *error = "bundle_digests must give model.aimodel, and only it, a 64-digit lowercase hex digest";
    return false;
  }
  out->bundle_digest = digest->string;
  return parse_initial_state(root.get("initial_state"), out, error);
}

} // namespace coreai_host
} // namespace backends
} // namespace executorch
