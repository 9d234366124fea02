// ./tokenize TOKENIZER --serve    the engine's tokenizer (csrc/tokenizer) as a pipe server for
//                                 scripts/prepare_data.py --tokenizer-backend engine: each worker
//                                 starts one and sends it batches of documents.
// ./tokenize TOKENIZER [TEXT]     prints the ids of TEXT (default: stdin), one line, for a look.
// TOKENIZER: a tokenizer.json or a model folder holding one (Tokenizer::load; anything it does not
// implement is refused at load, naming the key, and the program exits 1 with that message on
// stderr before it reads a request).
//
// Protocol on stdin/stdout, every integer 32-bit little-endian; one request, then its whole reply
// (the server reads a request completely before it writes, so a client that writes the request
// and then reads cannot deadlock on full pipes):
//   'E' n len[n] bytes   encode n UTF-8 texts (their bytes concatenated) without BOS/EOS
//     -> 0 count[n] ids   the ids of text i are count[i] consecutive ints
//   'D' n ids[n]          decode
//     -> 0 len bytes
//   'T' len bytes         the id of a token string (an added token or a vocab entry)
//     -> 0 id             (-1: not a token)
//   'I'                   the tokenizer: JSON {"vocab_size", "template_bos", "describe"}
//     -> 0 len bytes      template_bos: the id the post_processor prepends to a sequence, or null
// A request the tokenizer rejects (e.g. text that is not UTF-8) -> 1 len message, and the server
// goes on. End of stdin ends it (exit 0); a malformed request ends it with exit 2.
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "tokenizer/tokenizer.h"

namespace {

using engine::Tokenizer;

// Whole reads: false at a clean end of input before the first byte; a short read after it exits.
bool read_exact(void* dst, size_t n, bool eof_ok) {
  const size_t got = std::fread(dst, 1, n, stdin);
  if (got == n) return true;
  if (got == 0 && eof_ok && std::feof(stdin)) return false;
  std::fprintf(stderr, "tokenize --serve: truncated request (%zu of %zu bytes)\n", got, n);
  std::exit(2);
}

uint32_t read_u32() {
  uint32_t v;
  read_exact(&v, 4, false);
  return v;
}

void write_all(const void* src, size_t n) {
  if (n && std::fwrite(src, 1, n, stdout) != n) {
    std::fprintf(stderr, "tokenize --serve: cannot write the reply\n");
    std::exit(2);
  }
}

void write_u32(uint32_t v) { write_all(&v, 4); }

void reply_bytes(int32_t status, const std::string& s) {
  write_u32(static_cast<uint32_t>(status));
  write_u32(static_cast<uint32_t>(s.size()));
  write_all(s.data(), s.size());
}

int serve(const Tokenizer& tok) {
  static_assert(std::endian::native == std::endian::little, "the protocol is little-endian");
  std::vector<uint32_t> lens;
  std::string text;
  std::vector<uint32_t> counts;
  std::vector<int32_t> ids;
  for (char op; read_exact(&op, 1, true);) {
    try {
      if (op == 'E') {
        const uint32_t n = read_u32();
        lens.resize(n);
        read_exact(lens.data(), 4 * size_t{n}, false);
        size_t total = 0;
        for (uint32_t l : lens) total += l;
        text.resize(total);
        read_exact(text.data(), total, false);
        counts.resize(n);
        ids.clear();
        size_t at = 0;
        std::string error;
        for (uint32_t i = 0; i < n; ++i) {
          const size_t before = ids.size();
          try {
            const std::vector<int32_t> t = tok.encode(std::string_view(text).substr(at, lens[i]));
            ids.insert(ids.end(), t.begin(), t.end());
          } catch (const engine::Error& e) {
            if (error.empty()) error = engine::str_cat("text ", i, " of the batch: ", e.what());
          }
          counts[i] = static_cast<uint32_t>(ids.size() - before);
          at += lens[i];
        }
        if (!error.empty()) {
          reply_bytes(1, error);
        } else {
          write_u32(0);
          write_all(counts.data(), 4 * counts.size());
          write_all(ids.data(), 4 * ids.size());
        }
      } else if (op == 'D') {
        const uint32_t n = read_u32();
        ids.resize(n);
        read_exact(ids.data(), 4 * size_t{n}, false);
        reply_bytes(0, tok.decode(ids));
      } else if (op == 'T') {
        text.resize(read_u32());
        read_exact(text.data(), text.size(), false);
        const auto id = tok.token_to_id(text);
        write_u32(0);
        write_u32(static_cast<uint32_t>(id ? *id : -1));
      } else if (op == 'I') {
        nlohmann::json info = {{"vocab_size", tok.vocab_size()}, {"describe", tok.describe()}};
        const auto bos = tok.template_bos_id();
        info["template_bos"] = bos ? nlohmann::json(*bos) : nlohmann::json(nullptr);
        reply_bytes(0, info.dump());
      } else {
        std::fprintf(stderr, "tokenize --serve: unknown request 0x%02x\n", static_cast<unsigned char>(op));
        return 2;
      }
    } catch (const engine::Error& e) {
      reply_bytes(1, e.what());
    } catch (const std::bad_alloc&) {  // a request too large to encode: an error reply, not an abort
      reply_bytes(1, "out of memory while encoding this request (a document too large for this machine?)");
    } catch (const std::exception& e) {
      reply_bytes(1, std::string("internal error: ") + e.what());
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3 || std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0) {
    std::fprintf(stderr, "usage: tokenize TOKENIZER --serve | tokenize TOKENIZER [TEXT]\n");
    return argc < 2 ? 2 : 0;
  }
  try {
    const Tokenizer tok = Tokenizer::load(argv[1]);
    if (argc == 3 && std::strcmp(argv[2], "--serve") == 0) return serve(tok);
    const std::string text = argc == 3 ? std::string(argv[2])
                                       : std::string(std::istreambuf_iterator<char>(std::cin), {});
    std::string line;
    for (int32_t id : tok.encode(text)) line += (line.empty() ? "" : " ") + std::to_string(id);
    std::printf("%s\n", line.c_str());
    return 0;
  } catch (const engine::Error& e) {
    std::fprintf(stderr, "tokenize: %s\n", e.what());
    return 1;
  }
}
