/*
 * Optional verbs, resolved at run time so that the plugin loads on old rdma-core.
 *
 * A direct call to a verb binds the .so to that verb's symbol version node; the dynamic loader
 * then refuses the whole library on an rdma-core that lacks the node ("version `IBVERBS_1.12'
 * not found"), before NCCL can even print why. So every verb newer than IBVERBS_1.1 goes
 * through a wrapper below that looks the symbol up by its exact version node (dlvsym) in the
 * libibverbs already mapped into the process, and reports the verb as unsupported when the
 * node is absent. Callers degrade instead of failing:
 *
 *   verb                 node          rdma-core   without it
 *   ibv_reg_mr_iova2     IBVERBS_1.8   v28         plain ibv_reg_mr, no relaxed ordering
 *   ibv_query_ece        IBVERBS_1.10  v31         no ECE negotiation
 *   ibv_set_ece          IBVERBS_1.10  v31         no ECE negotiation
 *   _ibv_query_gid_ex    IBVERBS_1.11  v32         GID type read from sysfs (mpib_gid_type_sysfs)
 *   _ibv_query_gid_table IBVERBS_1.11  v32         the GID table read entry by entry
 *   ibv_reg_dmabuf_mr    IBVERBS_1.12  v34         no DMA-BUF registration
 *
 * (Nodes from libibverbs/libibverbs.map.in; the release is the first rdma-core tag whose map
 * holds the node.) Everything else the plugin calls is IBVERBS_1.1, present in every rdma-core.
 *
 * Every wrapper is safe from any thread; the first call (or mpib_verbs_load) does the look-up.
 */
#ifndef MPIB_VERBS_H
#define MPIB_VERBS_H

#include <stddef.h>
#include <stdint.h>

#include <infiniband/verbs.h>

/* Resolves the optional verbs once per process (pthread_once); later calls return at once. */
void mpib_verbs_load(void);

/* The verbs this libibverbs lacks, as "name@NODE (feature), ..." for one INFO line;
 * "" when all are present. The string is static and lives as long as the plugin. */
const char *mpib_verbs_missing(void);

/* The verbs' own signatures. When the verb is absent: NULL or EOPNOTSUPP, errno = EOPNOTSUPP. */
struct ibv_mr *mpib_ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned int access);
struct ibv_mr *mpib_ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                                      int access);
int mpib_ibv_query_gid_ex(struct ibv_context *context, uint32_t port_num, uint32_t gid_index,
                          struct ibv_gid_entry *entry, uint32_t flags);
/* How many entries one GID table query may ask for, for a port of tbl_len entries: twice that
 * (the call returns every port's valid entries), but no more than the command's output
 * attribute can describe (its length is 16 bits: 2047 entries; rxe's 1024-entry tables would
 * ask for 2048, and libibverbs refuses the whole call with EINVAL). */
size_t mpib_gid_table_room(int tbl_len);
/* Every valid GID entry of every port in one call (-errno on failure, -EOPNOTSUPP when absent). */
ssize_t mpib_ibv_query_gid_table(struct ibv_context *context, struct ibv_gid_entry *entries, size_t max_entries,
                                 uint32_t flags);
int mpib_ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece);
int mpib_ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece);

/* Registers addr..addr+length at iova = addr: through ibv_reg_mr_iova2 when present, else
 * through the IBVERBS_1.1 ibv_reg_mr with the optional-range bits (relaxed ordering) dropped,
 * since an old kernel/library rejects access bits it does not know. Use this rather than the
 * ibv_reg_mr macro with a non-constant access: that macro may emit a call to ibv_reg_mr_iova2. */
struct ibv_mr *mpib_ibv_reg_mr_compat(struct ibv_pd *pd, void *addr, size_t length, int access);

/* The type of GID index of devname's port (IBV_GID_TYPE_IB, _ROCE_V1 or _ROCE_V2) as the
 * kernel publishes it in /sys/class/infiniband/<dev>/ports/<port>/gid_attrs/types/<index>;
 * -1 when the entry is empty, unreadable or unknown. For libibverbs without _ibv_query_gid_ex. */
int mpib_gid_type_sysfs(const char *devname, int port, int index);

/* Tests: the same under another sysfs root, and the parser of one "types" file's text
 * ("RoCE v2", "IB/RoCE v1"); ethernet says whether the port's link layer is Ethernet. */
int mpib_gid_type_sysfs_at(const char *root, const char *devname, int port, int index);
int mpib_gid_type_parse(const char *text, int ethernet);

/* RoCE: the IP address a peer's GID stands for, the one whose neighbour entry (MAC) the kernel
 * resolves when a QP goes to RTR. Fills *out and returns its length; 0 for a GID with no
 * such address (RoCE v1 link-local, whose MAC is in the GID; zero; multicast). */
struct sockaddr_storage;
int mpib_gid_peer_addr(const uint8_t gid[16], struct sockaddr_storage *out);

/* Sends one empty UDP datagram to that address (port 9, discard), so the kernel resolves the
 * neighbour the ordinary way before the RTR transition needs it. Returns 0 when sent, 1 when
 * the GID names no address, -errno otherwise; never blocks. */
int mpib_neigh_warm(const uint8_t gid[16]);

/* Tests: resolve through lookup instead of libibverbs. Only before the first load. */
typedef void *(*mpib_verbs_lookup_fn)(const char *name, const char *version);
void mpib_verbs_use_lookup(mpib_verbs_lookup_fn lookup);

#endif
