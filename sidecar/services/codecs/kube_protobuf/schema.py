"""The Kubernetes API types the sidecar reads as protobuf, as a compact table.

Facts from the published API types (k8s.io/api and k8s.io/apimachinery `types.go`: the
`protobuf:"…,N,…"` field numbers, the `json:"name,omitempty"` tags, Go pointer fields;
the same numbers as the generated.proto files). `descriptors.py` compiles the table into
protobuf descriptors; `codec.py` turns decoded messages into the JSON Go's encoder
writes for the same object.

One block per message: its name on a line of its own, then one indented line per field,
in Go struct order (the order the Kubernetes JSON shows them):

    <json name> <field number> <type> [flags]

Types: `s` string, `b` bytes (base64 in JSON), `bool`, `i32`, `i64`, `[T]` a list of T,
`{T}` a map from string to T, or a message (`Name` in the same package, `pkg.Name`
elsewhere). Flags, as Go's JSON encoder needs them:

- `*` a Go pointer: a zero value that is on the wire is shown (`replicas: 0`,
  `automountServiceAccountToken: false`); an absent message is left out.
- `!` no `omitempty`: a zero scalar is shown, an empty list or map is `null`, an absent
  pointer is `null`.
- `^` an embedded struct (`json:",inline"`): its fields are shown in the parent.

A field that is not in this table is not silently dropped: a body that carries one is
refused (see codec.py), so what is listed here is exactly what the sidecar can read.
Deliberately left out: the volume sources of cloud and legacy storage drivers,
ephemeral containers and pod resource claims (field numbers that changed between
releases); a body using them gets a 415 asking for JSON.
"""

from __future__ import annotations

from dataclasses import dataclass

# Short package name → protobuf package of the published generated.proto.
PACKAGES: dict[str, str] = {
    "runtime": "k8s.io.apimachinery.pkg.runtime",
    "meta": "k8s.io.apimachinery.pkg.apis.meta.v1",
    "intstr": "k8s.io.apimachinery.pkg.util.intstr",
    "resource": "k8s.io.apimachinery.pkg.api.resource",
    "core": "k8s.io.api.core.v1",
    "apps": "k8s.io.api.apps.v1",
    "batch": "k8s.io.api.batch.v1",
    "rbac": "k8s.io.api.rbac.v1",
    "policy": "k8s.io.api.policy.v1",
    "scheduling": "k8s.io.api.scheduling.v1",
    "networking": "k8s.io.api.networking.v1",
    "authz": "k8s.io.api.authorization.v1",
    "authn": "k8s.io.api.authentication.v1",
}

MESSAGES: dict[str, str] = {}

MESSAGES["runtime"] = """
TypeMeta
  apiVersion 1 s
  kind 2 s
Unknown
  typeMeta 1 TypeMeta
  raw 2 b
  contentEncoding 3 s
  contentType 4 s
"""

MESSAGES["intstr"] = """
IntOrString
  type 1 i64
  intVal 2 i32
  strVal 3 s
"""

MESSAGES["resource"] = """
Quantity
  string 1 s
"""

MESSAGES["meta"] = """
Time
  seconds 1 i64
  nanos 2 i32
FieldsV1
  Raw 1 b
OwnerReference
  apiVersion 5 s !
  kind 1 s !
  name 3 s !
  uid 4 s !
  controller 6 bool *
  blockOwnerDeletion 7 bool *
ManagedFieldsEntry
  manager 1 s
  operation 2 s
  apiVersion 3 s
  time 4 Time *
  fieldsType 6 s
  fieldsV1 7 FieldsV1 *
  subresource 8 s
ObjectMeta
  name 1 s
  generateName 2 s
  namespace 3 s
  selfLink 4 s
  uid 5 s
  resourceVersion 6 s
  generation 7 i64
  creationTimestamp 8 Time
  deletionTimestamp 9 Time *
  deletionGracePeriodSeconds 10 i64 *
  labels 11 {s}
  annotations 12 {s}
  ownerReferences 13 [OwnerReference]
  finalizers 14 [s]
  managedFields 17 [ManagedFieldsEntry]
Preconditions
  uid 1 s *
  resourceVersion 2 s *
DeleteOptions
  gracePeriodSeconds 1 i64 *
  preconditions 2 Preconditions *
  orphanDependents 3 bool *
  propagationPolicy 4 s *
  dryRun 5 [s]
  ignoreStoreReadErrorWithClusterBreakingPotential 6 bool *
LabelSelector
  matchLabels 1 {s}
  matchExpressions 2 [LabelSelectorRequirement]
LabelSelectorRequirement
  key 1 s !
  operator 2 s !
  values 3 [s]
Condition
  type 1 s !
  status 2 s !
  observedGeneration 3 i64
  lastTransitionTime 4 Time !
  reason 5 s !
  message 6 s !
"""

MESSAGES["core"] = """
ConfigMap
  metadata 1 meta.ObjectMeta
  immutable 4 bool *
  data 2 {s}
  binaryData 3 {b}
Secret
  metadata 1 meta.ObjectMeta
  immutable 5 bool *
  data 2 {b}
  stringData 4 {s}
  type 3 s
Namespace
  metadata 1 meta.ObjectMeta
  spec 2 NamespaceSpec
  status 3 NamespaceStatus
NamespaceSpec
  finalizers 1 [s]
NamespaceStatus
  phase 1 s
  conditions 2 [NamespaceCondition]
NamespaceCondition
  type 1 s !
  status 2 s !
  lastTransitionTime 4 meta.Time
  reason 5 s
  message 6 s
ServiceAccount
  metadata 1 meta.ObjectMeta
  secrets 2 [ObjectReference]
  imagePullSecrets 3 [LocalObjectReference]
  automountServiceAccountToken 4 bool *
ObjectReference
  kind 1 s
  namespace 2 s
  name 3 s
  uid 4 s
  apiVersion 5 s
  resourceVersion 6 s
  fieldPath 7 s
LocalObjectReference
  name 1 s
TypedLocalObjectReference
  apiGroup 1 s *!
  kind 2 s !
  name 3 s !
TypedObjectReference
  apiGroup 1 s *!
  kind 2 s !
  name 3 s !
  namespace 4 s *

Service
  metadata 1 meta.ObjectMeta
  spec 2 ServiceSpec
  status 3 ServiceStatus
ServiceSpec
  ports 1 [ServicePort]
  selector 2 {s}
  clusterIP 3 s
  clusterIPs 18 [s]
  type 4 s
  externalIPs 5 [s]
  sessionAffinity 7 s
  loadBalancerIP 8 s
  loadBalancerSourceRanges 9 [s]
  externalName 10 s
  externalTrafficPolicy 11 s
  healthCheckNodePort 12 i32
  publishNotReadyAddresses 13 bool
  sessionAffinityConfig 14 SessionAffinityConfig *
  ipFamilies 19 [s]
  ipFamilyPolicy 17 s *
  allocateLoadBalancerNodePorts 20 bool *
  loadBalancerClass 21 s *
  internalTrafficPolicy 22 s *
ServicePort
  name 1 s
  protocol 2 s
  appProtocol 6 s *
  port 3 i32 !
  targetPort 4 intstr.IntOrString
  nodePort 5 i32
SessionAffinityConfig
  clientIP 1 ClientIPConfig *
ClientIPConfig
  timeoutSeconds 1 i32 *
ServiceStatus
  loadBalancer 1 LoadBalancerStatus
  conditions 2 [meta.Condition]
LoadBalancerStatus
  ingress 1 [LoadBalancerIngress]
LoadBalancerIngress
  ip 1 s
  hostname 2 s
  ipMode 3 s *
  ports 4 [PortStatus]
PortStatus
  port 1 i32 !
  protocol 2 s !
  error 3 s *

ResourceQuota
  metadata 1 meta.ObjectMeta
  spec 2 ResourceQuotaSpec
  status 3 ResourceQuotaStatus
ResourceQuotaSpec
  hard 1 {resource.Quantity}
  scopes 2 [s]
  scopeSelector 3 ScopeSelector *
ScopeSelector
  matchExpressions 1 [ScopedResourceSelectorRequirement]
ScopedResourceSelectorRequirement
  scopeName 1 s !
  operator 2 s !
  values 3 [s]
ResourceQuotaStatus
  hard 1 {resource.Quantity}
  used 2 {resource.Quantity}

PodTemplateSpec
  metadata 1 meta.ObjectMeta
  spec 2 PodSpec
PodSpec
  volumes 1 [Volume]
  initContainers 20 [Container]
  containers 2 [Container] !
  restartPolicy 3 s
  terminationGracePeriodSeconds 4 i64 *
  activeDeadlineSeconds 5 i64 *
  dnsPolicy 6 s
  nodeSelector 7 {s}
  serviceAccountName 8 s
  serviceAccount 9 s
  automountServiceAccountToken 21 bool *
  nodeName 10 s
  hostNetwork 11 bool
  hostPID 12 bool
  hostIPC 13 bool
  shareProcessNamespace 27 bool *
  securityContext 14 PodSecurityContext *
  imagePullSecrets 15 [LocalObjectReference]
  hostname 16 s
  subdomain 17 s
  affinity 18 Affinity *
  schedulerName 19 s
  tolerations 22 [Toleration]
  hostAliases 23 [HostAlias]
  priorityClassName 24 s
  priority 25 i32 *
  dnsConfig 26 PodDNSConfig *
  readinessGates 28 [PodReadinessGate]
  runtimeClassName 29 s *
  enableServiceLinks 30 bool *
  preemptionPolicy 31 s *
  overhead 32 {resource.Quantity}
  topologySpreadConstraints 33 [TopologySpreadConstraint]
  setHostnameAsFQDN 35 bool *
  os 36 PodOS *
  hostUsers 37 bool *
  schedulingGates 38 [PodSchedulingGate]
Container
  name 1 s !
  image 2 s
  command 3 [s]
  args 4 [s]
  workingDir 5 s
  ports 6 [ContainerPort]
  envFrom 19 [EnvFromSource]
  env 7 [EnvVar]
  resources 8 ResourceRequirements
  resizePolicy 23 [ContainerResizePolicy]
  restartPolicy 24 s *
  volumeMounts 9 [VolumeMount]
  volumeDevices 21 [VolumeDevice]
  livenessProbe 10 Probe *
  readinessProbe 11 Probe *
  startupProbe 22 Probe *
  lifecycle 12 Lifecycle *
  terminationMessagePath 13 s
  terminationMessagePolicy 20 s
  imagePullPolicy 14 s
  securityContext 15 SecurityContext *
  stdin 16 bool
  stdinOnce 17 bool
  tty 18 bool
ContainerPort
  name 1 s
  hostPort 2 i32
  containerPort 3 i32 !
  protocol 4 s
  hostIP 5 s
EnvFromSource
  prefix 1 s
  configMapRef 2 ConfigMapEnvSource *
  secretRef 3 SecretEnvSource *
ConfigMapEnvSource
  localObjectReference 1 LocalObjectReference ^
  optional 2 bool *
SecretEnvSource
  localObjectReference 1 LocalObjectReference ^
  optional 2 bool *
EnvVar
  name 1 s !
  value 2 s
  valueFrom 3 EnvVarSource *
EnvVarSource
  fieldRef 1 ObjectFieldSelector *
  resourceFieldRef 2 ResourceFieldSelector *
  configMapKeyRef 3 ConfigMapKeySelector *
  secretKeyRef 4 SecretKeySelector *
ObjectFieldSelector
  apiVersion 1 s
  fieldPath 2 s !
ResourceFieldSelector
  containerName 1 s
  resource 2 s !
  divisor 3 resource.Quantity
ConfigMapKeySelector
  localObjectReference 1 LocalObjectReference ^
  key 2 s !
  optional 3 bool *
SecretKeySelector
  localObjectReference 1 LocalObjectReference ^
  key 2 s !
  optional 3 bool *
ResourceRequirements
  limits 1 {resource.Quantity}
  requests 2 {resource.Quantity}
  claims 3 [ResourceClaim]
ResourceClaim
  name 1 s !
VolumeResourceRequirements
  limits 1 {resource.Quantity}
  requests 2 {resource.Quantity}
ContainerResizePolicy
  resourceName 1 s !
  restartPolicy 2 s !
VolumeMount
  name 1 s !
  readOnly 2 bool
  mountPath 3 s !
  subPath 4 s
  mountPropagation 5 s *
  subPathExpr 6 s
VolumeDevice
  name 1 s !
  devicePath 2 s !
Probe
  handler 1 ProbeHandler ^
  initialDelaySeconds 2 i32
  timeoutSeconds 3 i32
  periodSeconds 4 i32
  successThreshold 5 i32
  failureThreshold 6 i32
  terminationGracePeriodSeconds 7 i64 *
ProbeHandler
  exec 1 ExecAction *
  httpGet 2 HTTPGetAction *
  tcpSocket 3 TCPSocketAction *
  grpc 4 GRPCAction *
Lifecycle
  postStart 1 LifecycleHandler *
  preStop 2 LifecycleHandler *
LifecycleHandler
  exec 1 ExecAction *
  httpGet 2 HTTPGetAction *
  tcpSocket 3 TCPSocketAction *
  sleep 4 SleepAction *
ExecAction
  command 1 [s]
HTTPGetAction
  path 1 s
  port 2 intstr.IntOrString !
  host 3 s
  scheme 4 s
  httpHeaders 5 [HTTPHeader]
HTTPHeader
  name 1 s !
  value 2 s !
TCPSocketAction
  port 1 intstr.IntOrString !
  host 2 s
GRPCAction
  port 1 i32 !
  service 2 s *!
SleepAction
  seconds 1 i64 !
SecurityContext
  capabilities 1 Capabilities *
  privileged 2 bool *
  seLinuxOptions 3 SELinuxOptions *
  windowsOptions 10 WindowsSecurityContextOptions *
  runAsUser 4 i64 *
  runAsGroup 8 i64 *
  runAsNonRoot 5 bool *
  readOnlyRootFilesystem 6 bool *
  allowPrivilegeEscalation 7 bool *
  procMount 9 s *
  seccompProfile 11 SeccompProfile *
Capabilities
  add 1 [s]
  drop 2 [s]
SELinuxOptions
  user 1 s
  role 2 s
  type 3 s
  level 4 s
WindowsSecurityContextOptions
  gmsaCredentialSpecName 1 s *
  gmsaCredentialSpec 2 s *
  runAsUserName 3 s *
  hostProcess 4 bool *
SeccompProfile
  type 1 s !
  localhostProfile 2 s *
PodSecurityContext
  seLinuxOptions 1 SELinuxOptions *
  windowsOptions 8 WindowsSecurityContextOptions *
  runAsUser 2 i64 *
  runAsGroup 6 i64 *
  runAsNonRoot 3 bool *
  supplementalGroups 4 [i64]
  fsGroup 5 i64 *
  sysctls 7 [Sysctl]
  fsGroupChangePolicy 9 s *
  seccompProfile 10 SeccompProfile *
Sysctl
  name 1 s !
  value 2 s !
Affinity
  nodeAffinity 1 NodeAffinity *
  podAffinity 2 PodAffinity *
  podAntiAffinity 3 PodAntiAffinity *
NodeAffinity
  requiredDuringSchedulingIgnoredDuringExecution 1 NodeSelector *
  preferredDuringSchedulingIgnoredDuringExecution 2 [PreferredSchedulingTerm]
NodeSelector
  nodeSelectorTerms 1 [NodeSelectorTerm] !
NodeSelectorTerm
  matchExpressions 1 [NodeSelectorRequirement]
  matchFields 2 [NodeSelectorRequirement]
NodeSelectorRequirement
  key 1 s !
  operator 2 s !
  values 3 [s]
PreferredSchedulingTerm
  weight 1 i32 !
  preference 2 NodeSelectorTerm !
PodAffinity
  requiredDuringSchedulingIgnoredDuringExecution 1 [PodAffinityTerm]
  preferredDuringSchedulingIgnoredDuringExecution 2 [WeightedPodAffinityTerm]
PodAntiAffinity
  requiredDuringSchedulingIgnoredDuringExecution 1 [PodAffinityTerm]
  preferredDuringSchedulingIgnoredDuringExecution 2 [WeightedPodAffinityTerm]
WeightedPodAffinityTerm
  weight 1 i32 !
  podAffinityTerm 2 PodAffinityTerm !
PodAffinityTerm
  labelSelector 1 meta.LabelSelector *
  namespaces 2 [s]
  topologyKey 3 s !
  namespaceSelector 4 meta.LabelSelector *
  matchLabelKeys 5 [s]
  mismatchLabelKeys 6 [s]
Toleration
  key 1 s
  operator 2 s
  value 3 s
  effect 4 s
  tolerationSeconds 5 i64 *
HostAlias
  ip 1 s
  hostnames 2 [s]
PodDNSConfig
  nameservers 1 [s]
  searches 2 [s]
  options 3 [PodDNSConfigOption]
PodDNSConfigOption
  name 1 s
  value 2 s *
PodReadinessGate
  conditionType 1 s !
PodOS
  name 1 s !
PodSchedulingGate
  name 1 s !
TopologySpreadConstraint
  maxSkew 1 i32 !
  topologyKey 2 s !
  whenUnsatisfiable 3 s !
  labelSelector 4 meta.LabelSelector *
  minDomains 5 i32 *
  nodeAffinityPolicy 6 s *
  nodeTaintsPolicy 7 s *
  matchLabelKeys 8 [s]

Volume
  name 1 s !
  volumeSource 2 VolumeSource ^
VolumeSource
  hostPath 1 HostPathVolumeSource *
  emptyDir 2 EmptyDirVolumeSource *
  secret 6 SecretVolumeSource *
  nfs 7 NFSVolumeSource *
  persistentVolumeClaim 10 PersistentVolumeClaimVolumeSource *
  downwardAPI 16 DownwardAPIVolumeSource *
  configMap 19 ConfigMapVolumeSource *
  projected 26 ProjectedVolumeSource *
  csi 28 CSIVolumeSource *
  ephemeral 29 EphemeralVolumeSource *
HostPathVolumeSource
  path 1 s !
  type 2 s *
EmptyDirVolumeSource
  medium 1 s
  sizeLimit 2 resource.Quantity *
SecretVolumeSource
  secretName 1 s
  items 2 [KeyToPath]
  defaultMode 3 i32 *
  optional 4 bool *
NFSVolumeSource
  server 1 s !
  path 2 s !
  readOnly 3 bool
PersistentVolumeClaimVolumeSource
  claimName 1 s !
  readOnly 2 bool
DownwardAPIVolumeSource
  items 1 [DownwardAPIVolumeFile]
  defaultMode 2 i32 *
DownwardAPIVolumeFile
  path 1 s !
  fieldRef 2 ObjectFieldSelector *
  resourceFieldRef 3 ResourceFieldSelector *
  mode 4 i32 *
ConfigMapVolumeSource
  localObjectReference 1 LocalObjectReference ^
  items 2 [KeyToPath]
  defaultMode 3 i32 *
  optional 4 bool *
KeyToPath
  key 1 s !
  path 2 s !
  mode 3 i32 *
ProjectedVolumeSource
  sources 1 [VolumeProjection] !
  defaultMode 2 i32 *
VolumeProjection
  secret 1 SecretProjection *
  downwardAPI 2 DownwardAPIProjection *
  configMap 3 ConfigMapProjection *
  serviceAccountToken 4 ServiceAccountTokenProjection *
  clusterTrustBundle 5 ClusterTrustBundleProjection *
SecretProjection
  localObjectReference 1 LocalObjectReference ^
  items 2 [KeyToPath]
  optional 4 bool *
ConfigMapProjection
  localObjectReference 1 LocalObjectReference ^
  items 2 [KeyToPath]
  optional 4 bool *
DownwardAPIProjection
  items 1 [DownwardAPIVolumeFile]
ServiceAccountTokenProjection
  audience 1 s
  expirationSeconds 2 i64 *
  path 3 s !
ClusterTrustBundleProjection
  name 1 s *
  signerName 2 s *
  labelSelector 3 meta.LabelSelector *
  optional 5 bool *
  path 4 s !
CSIVolumeSource
  driver 1 s !
  readOnly 2 bool *
  fsType 3 s *
  volumeAttributes 4 {s}
  nodePublishSecretRef 5 LocalObjectReference *
EphemeralVolumeSource
  volumeClaimTemplate 1 PersistentVolumeClaimTemplate *
PersistentVolumeClaimTemplate
  metadata 1 meta.ObjectMeta
  spec 2 PersistentVolumeClaimSpec !
PersistentVolumeClaimSpec
  accessModes 1 [s]
  selector 4 meta.LabelSelector *
  resources 2 VolumeResourceRequirements
  volumeName 3 s
  storageClassName 5 s *
  volumeMode 6 s *
  dataSource 7 TypedLocalObjectReference *
  dataSourceRef 8 TypedObjectReference *
  volumeAttributesClassName 9 s *
"""

MESSAGES["apps"] = """
Deployment
  metadata 1 meta.ObjectMeta
  spec 2 DeploymentSpec
  status 3 DeploymentStatus
DeploymentSpec
  replicas 1 i32 *
  selector 2 meta.LabelSelector *!
  template 3 core.PodTemplateSpec !
  strategy 4 DeploymentStrategy
  minReadySeconds 5 i32
  revisionHistoryLimit 6 i32 *
  paused 7 bool
  progressDeadlineSeconds 9 i32 *
DeploymentStrategy
  type 1 s
  rollingUpdate 2 RollingUpdateDeployment *
RollingUpdateDeployment
  maxUnavailable 1 intstr.IntOrString *
  maxSurge 2 intstr.IntOrString *
DeploymentStatus
  observedGeneration 1 i64
  replicas 2 i32
  updatedReplicas 3 i32
  readyReplicas 7 i32
  availableReplicas 4 i32
  unavailableReplicas 5 i32
  conditions 6 [DeploymentCondition]
  collisionCount 8 i32 *
DeploymentCondition
  type 1 s !
  status 2 s !
  lastUpdateTime 6 meta.Time
  lastTransitionTime 7 meta.Time
  reason 4 s
  message 5 s
"""

MESSAGES["batch"] = """
Job
  metadata 1 meta.ObjectMeta
  spec 2 JobSpec
  status 3 JobStatus
JobSpec
  parallelism 1 i32 *
  completions 2 i32 *
  activeDeadlineSeconds 3 i64 *
  podFailurePolicy 11 PodFailurePolicy *
  successPolicy 16 SuccessPolicy *
  backoffLimit 7 i32 *
  backoffLimitPerIndex 12 i32 *
  maxFailedIndexes 13 i32 *
  selector 4 meta.LabelSelector *
  manualSelector 5 bool *
  template 6 core.PodTemplateSpec !
  ttlSecondsAfterFinished 8 i32 *
  completionMode 9 s *
  suspend 10 bool *
PodFailurePolicy
  rules 1 [PodFailurePolicyRule] !
PodFailurePolicyRule
  action 1 s !
  onExitCodes 2 PodFailurePolicyOnExitCodesRequirement *!
  onPodConditions 3 [PodFailurePolicyOnPodConditionsPattern] !
PodFailurePolicyOnExitCodesRequirement
  containerName 1 s *!
  operator 2 s !
  values 3 [i32] !
PodFailurePolicyOnPodConditionsPattern
  type 1 s !
  status 2 s !
SuccessPolicy
  rules 1 [SuccessPolicyRule] !
SuccessPolicyRule
  succeededIndexes 1 s *
  succeededCount 2 i32 *
JobStatus
  conditions 1 [JobCondition]
  startTime 2 meta.Time *
  completionTime 3 meta.Time *
  active 4 i32
  succeeded 5 i32
  failed 6 i32
  completedIndexes 7 s
  uncountedTerminatedPods 8 UncountedTerminatedPods *
  ready 9 i32 *
UncountedTerminatedPods
  succeeded 1 [s]
  failed 2 [s]
JobCondition
  type 1 s !
  status 2 s !
  lastProbeTime 3 meta.Time
  lastTransitionTime 4 meta.Time
  reason 5 s
  message 6 s
JobTemplateSpec
  metadata 1 meta.ObjectMeta
  spec 2 JobSpec
CronJob
  metadata 1 meta.ObjectMeta
  spec 2 CronJobSpec
  status 3 CronJobStatus
CronJobSpec
  schedule 1 s !
  timeZone 8 s *
  startingDeadlineSeconds 2 i64 *
  concurrencyPolicy 3 s
  suspend 4 bool *
  jobTemplate 5 JobTemplateSpec !
  successfulJobsHistoryLimit 6 i32 *
  failedJobsHistoryLimit 7 i32 *
CronJobStatus
  active 1 [core.ObjectReference]
  lastScheduleTime 4 meta.Time *
  lastSuccessfulTime 5 meta.Time *
"""

MESSAGES["rbac"] = """
PolicyRule
  verbs 1 [s] !
  apiGroups 2 [s]
  resources 3 [s]
  resourceNames 4 [s]
  nonResourceURLs 5 [s]
Subject
  kind 1 s !
  apiGroup 2 s
  name 3 s !
  namespace 4 s
RoleRef
  apiGroup 1 s !
  kind 2 s !
  name 3 s !
Role
  metadata 1 meta.ObjectMeta
  rules 2 [PolicyRule] !
RoleBinding
  metadata 1 meta.ObjectMeta
  subjects 2 [Subject]
  roleRef 3 RoleRef !
ClusterRole
  metadata 1 meta.ObjectMeta
  rules 2 [PolicyRule] !
  aggregationRule 3 AggregationRule *
AggregationRule
  clusterRoleSelectors 1 [meta.LabelSelector]
ClusterRoleBinding
  metadata 1 meta.ObjectMeta
  subjects 2 [Subject]
  roleRef 3 RoleRef !
"""

MESSAGES["policy"] = """
Eviction
  metadata 1 meta.ObjectMeta
  deleteOptions 2 meta.DeleteOptions *
PodDisruptionBudget
  metadata 1 meta.ObjectMeta
  spec 2 PodDisruptionBudgetSpec
  status 3 PodDisruptionBudgetStatus
PodDisruptionBudgetSpec
  minAvailable 1 intstr.IntOrString *
  selector 2 meta.LabelSelector *
  maxUnavailable 3 intstr.IntOrString *
  unhealthyPodEvictionPolicy 4 s *
PodDisruptionBudgetStatus
  observedGeneration 1 i64
  disruptedPods 2 {meta.Time}
  disruptionsAllowed 3 i32 !
  currentHealthy 4 i32 !
  desiredHealthy 5 i32 !
  expectedPods 6 i32 !
  conditions 7 [meta.Condition]
"""

MESSAGES["scheduling"] = """
PriorityClass
  metadata 1 meta.ObjectMeta
  value 2 i32 !
  globalDefault 3 bool
  description 4 s
  preemptionPolicy 5 s *
"""

MESSAGES["networking"] = """
Ingress
  metadata 1 meta.ObjectMeta
  spec 2 IngressSpec
  status 3 IngressStatus
IngressSpec
  ingressClassName 4 s *
  defaultBackend 1 IngressBackend *
  tls 2 [IngressTLS]
  rules 3 [IngressRule]
IngressTLS
  hosts 1 [s]
  secretName 2 s
IngressRule
  host 1 s
  ingressRuleValue 2 IngressRuleValue ^
IngressRuleValue
  http 1 HTTPIngressRuleValue *
HTTPIngressRuleValue
  paths 1 [HTTPIngressPath] !
HTTPIngressPath
  path 1 s
  pathType 3 s *!
  backend 2 IngressBackend !
IngressBackend
  service 4 IngressServiceBackend *
  resource 3 core.TypedLocalObjectReference *
IngressServiceBackend
  name 1 s !
  port 2 ServiceBackendPort
ServiceBackendPort
  name 1 s
  number 2 i32
IngressStatus
  loadBalancer 1 IngressLoadBalancerStatus
IngressLoadBalancerStatus
  ingress 1 [IngressLoadBalancerIngress]
IngressLoadBalancerIngress
  ip 1 s
  hostname 2 s
  ports 4 [IngressPortStatus]
IngressPortStatus
  port 1 i32 !
  protocol 2 s !
  error 3 s *
"""

MESSAGES["authz"] = """
ExtraValue
  items 1 [s]
FieldSelectorRequirement
  key 1 s !
  operator 2 s !
  values 3 [s]
FieldSelectorAttributes
  rawSelector 1 s
  requirements 2 [FieldSelectorRequirement]
LabelSelectorAttributes
  rawSelector 1 s
  requirements 2 [meta.LabelSelectorRequirement]
ResourceAttributes
  namespace 1 s
  verb 2 s
  group 3 s
  version 4 s
  resource 5 s
  subresource 6 s
  name 7 s
  fieldSelector 8 FieldSelectorAttributes *
  labelSelector 9 LabelSelectorAttributes *
NonResourceAttributes
  path 1 s
  verb 2 s
SelfSubjectAccessReviewSpec
  resourceAttributes 1 ResourceAttributes *
  nonResourceAttributes 2 NonResourceAttributes *
SubjectAccessReviewSpec
  resourceAttributes 1 ResourceAttributes *
  nonResourceAttributes 2 NonResourceAttributes *
  user 3 s
  groups 4 [s]
  extra 5 {ExtraValue}
  uid 6 s
SubjectAccessReviewStatus
  allowed 1 bool !
  denied 4 bool
  reason 2 s
  evaluationError 3 s
SelfSubjectAccessReview
  metadata 1 meta.ObjectMeta
  spec 2 SelfSubjectAccessReviewSpec !
  status 3 SubjectAccessReviewStatus
SubjectAccessReview
  metadata 1 meta.ObjectMeta
  spec 2 SubjectAccessReviewSpec !
  status 3 SubjectAccessReviewStatus
SelfSubjectRulesReviewSpec
  namespace 1 s
ResourceRule
  verbs 1 [s] !
  apiGroups 2 [s]
  resources 3 [s]
  resourceNames 4 [s]
NonResourceRule
  verbs 1 [s] !
  nonResourceURLs 2 [s]
SubjectRulesReviewStatus
  resourceRules 1 [ResourceRule] !
  nonResourceRules 2 [NonResourceRule] !
  incomplete 3 bool !
  evaluationError 4 s
SelfSubjectRulesReview
  metadata 1 meta.ObjectMeta
  spec 2 SelfSubjectRulesReviewSpec !
  status 3 SubjectRulesReviewStatus
"""

MESSAGES["authn"] = """
ExtraValue
  items 1 [s]
UserInfo
  username 1 s
  uid 2 s
  groups 3 [s]
  extra 4 {ExtraValue}
SelfSubjectReviewStatus
  userInfo 1 UserInfo
SelfSubjectReview
  metadata 1 meta.ObjectMeta
  status 2 SelfSubjectReviewStatus
"""


@dataclass(frozen=True)
class Kind:
    """A kind the sidecar reads as protobuf: its message and the one resource such a
    body may be sent to (API group, plural)."""

    message: str
    group: str
    resource: str


# (apiVersion, kind) → what a body of that kind is. The review kinds are answered by
# the sidecar itself; the others are what `kubectl create <generator>` sends.
KINDS: dict[tuple[str, str], Kind] = {
    ("v1", "ConfigMap"): Kind("core.ConfigMap", "", "configmaps"),
    ("v1", "Secret"): Kind("core.Secret", "", "secrets"),
    ("v1", "Namespace"): Kind("core.Namespace", "", "namespaces"),
    ("v1", "ServiceAccount"): Kind("core.ServiceAccount", "", "serviceaccounts"),
    ("v1", "Service"): Kind("core.Service", "", "services"),
    ("v1", "ResourceQuota"): Kind("core.ResourceQuota", "", "resourcequotas"),
    ("apps/v1", "Deployment"): Kind("apps.Deployment", "apps", "deployments"),
    ("batch/v1", "Job"): Kind("batch.Job", "batch", "jobs"),
    ("batch/v1", "CronJob"): Kind("batch.CronJob", "batch", "cronjobs"),
    ("rbac.authorization.k8s.io/v1", "Role"): Kind(
        "rbac.Role", "rbac.authorization.k8s.io", "roles"
    ),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): Kind(
        "rbac.RoleBinding", "rbac.authorization.k8s.io", "rolebindings"
    ),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): Kind(
        "rbac.ClusterRole", "rbac.authorization.k8s.io", "clusterroles"
    ),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): Kind(
        "rbac.ClusterRoleBinding", "rbac.authorization.k8s.io", "clusterrolebindings"
    ),
    ("policy/v1", "PodDisruptionBudget"): Kind(
        "policy.PodDisruptionBudget", "policy", "poddisruptionbudgets"
    ),
    ("scheduling.k8s.io/v1", "PriorityClass"): Kind(
        "scheduling.PriorityClass", "scheduling.k8s.io", "priorityclasses"
    ),
    ("networking.k8s.io/v1", "Ingress"): Kind(
        "networking.Ingress", "networking.k8s.io", "ingresses"
    ),
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview"): Kind(
        "authz.SelfSubjectAccessReview", "authorization.k8s.io", "selfsubjectaccessreviews"
    ),
    ("authorization.k8s.io/v1", "SubjectAccessReview"): Kind(
        "authz.SubjectAccessReview", "authorization.k8s.io", "subjectaccessreviews"
    ),
    ("authorization.k8s.io/v1", "SelfSubjectRulesReview"): Kind(
        "authz.SelfSubjectRulesReview", "authorization.k8s.io", "selfsubjectrulesreviews"
    ),
    ("authentication.k8s.io/v1", "SelfSubjectReview"): Kind(
        "authn.SelfSubjectReview", "authentication.k8s.io", "selfsubjectreviews"
    ),
    # `kubectl drain`: the pods/eviction subresource's body (the typed policy client).
    ("policy/v1", "Eviction"): Kind("policy.Eviction", "", "pods"),
}
# Not objects of a resource but a request's options (`DELETE` bodies): the kinds
# `pipeline/transcode.py` places by method and subresource rather than by resource.
OPTION_KINDS = frozenset({"DeleteOptions", "Eviction"})
# A typed client encodes DeleteOptions with its own group version (kubectl drain's
# DELETE of a pod: `v1`), so it is read under each API version a body may name.
for _version in sorted({v for v, _ in KINDS} | {"meta.k8s.io/v1"}):
    KINDS[(_version, "DeleteOptions")] = Kind("meta.DeleteOptions", "", "")
