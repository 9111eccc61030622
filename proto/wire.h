/* wire.h — the versioned wire layer shared by tah-coord and tah-node.
 *
 * Control plane: one ZeroMQ frame = one packed tah.Envelope (tah.proto).
 * On ROUTER sockets the frame is preceded by the peer's routing id.
 * Data plane: two frames, [packed tah.DataHeader][payload].
 *
 * Every unpack of bytes from the network goes through wire_*_unpack, which
 * rejects (returns NULL and fills err) anything that is not a well-formed
 * message of this protocol version: undecodable bytes, a size over the
 * limit, a wrong version, an envelope without a body. The caller frees with
 * wire_envelope_free / wire_header_free.
 *
 * The zmq helpers send without blocking where a peer may be slow
 * (ZMQ_DONTWAIT on ROUTER replies: a full queue drops the reply, as ZeroMQ
 * ROUTERs do) and return 0 or a negative TAH_E* code. */
#ifndef TAH_WIRE_H
#define TAH_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include <zmq.h> /* zmq_msg_t */

#include "tah.pb-c.h" /* Tah__Envelope, Tah__DataHeader, ... */

/* 2: a TIED message from the first stage carries only the wte rows its step
 * touched (node/link.h), and through the job's tied_codec */
#define TAH_PROTO_VERSION 2u
/* Largest control message accepted (a job file plus its strings). */
#define WIRE_MAX_CONTROL (1u << 20)
/* Largest data header accepted. */
#define WIRE_MAX_HEADER 512u

Tah__Envelope *wire_envelope_unpack(const void *buf, size_t len, char *err, size_t errlen);
void wire_envelope_free(Tah__Envelope **e);
/* Name of the envelope's body ("hello"), for logs. */
const char *wire_body_name(const Tah__Envelope *e);

Tah__DataHeader *wire_header_unpack(const void *buf, size_t len, char *err, size_t errlen);
void wire_header_free(Tah__DataHeader **h);
const char *wire_data_kind_name(uint32_t kind);

/* Pack env (version is set here) and send it as one frame, preceded by
 * rid (ROUTER) when rid is not NULL. flags: 0 or ZMQ_DONTWAIT. */
int wire_send_envelope(void *sock, const void *rid, size_t rid_len, Tah__Envelope *env, int flags);
/* Convenience: an Error reply. */
int wire_send_error(void *sock, const void *rid, size_t rid_len, int code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Receive one control message from a DEALER/REQ-like socket (no routing
 * id) with a timeout in ms; NULL on timeout (*timed_out = 1) or a bad
 * message (err). */
Tah__Envelope *wire_recv_envelope(void *sock, int timeout_ms, int *timed_out, char *err, size_t errlen);
/* Receive the waiting multipart message without blocking: its first nmax
 * parts go to parts[] (*nparts of them; the caller closes them), the rest are
 * received and dropped. Returns how many parts the message had (0: none). */
int wire_recv_parts(void *sock, zmq_msg_t *parts, int nmax, int *nparts);

/* "HOST:PORT" -> "tcp://HOST:PORT" (port 0 -> "*", an ephemeral port when
 * binding). 0, or TAH_EINVAL with a message. A string that already starts
 * with tcp:// or ipc:// or inproc:// is copied as is. */
int wire_endpoint(const char *hostport, char *out, size_t outlen, char *err, size_t errlen);

#endif
