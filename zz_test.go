package multiprobe_test
import ("testing";"time";"fmt";"sort";"runtime";"github.com/multiprobe/multiprobe";"github.com/multiprobe/multiprobe/testprogs";"github.com/multiprobe/multiprobe/kernelprobe";"github.com/cilium/ebpf/link")
func med(d []time.Duration) time.Duration { sort.Slice(d, func(i,j int) bool {return d[i]<d[j]}); return d[len(d)/2] }
func TestZZ(t *testing.T){
	c, _ := testprogs.LoadCounter(kernelprobe.PathUprobeMulti)
	defer c.Close()
	n:=100000
	target := testprogs.BuildTarget(t, n)
	names := make([]string, n)
	for i := range names { names[i] = testprogs.FuncName(i) }
	probes, _ := multiprobe.ParseProbes("uprobe:" + target + ":func_*")
	var r,a,cl, ca, cc, tot, ctot []time.Duration
	for i:=0;i<14;i++{
		runtime.GC()
		t0:=time.Now()
		sites, err := multiprobe.Resolve(probes); if err!=nil {t.Fatal(err)}
		t1:=time.Now()
		l, err := multiprobe.AttachSites(c.CountEntry, sites, nil); if err!=nil {t.Fatal(err)}
		t2:=time.Now()
		l.Close()
		t3:=time.Now()
		runtime.GC()
		t3 = time.Now()
		ex, _ := link.OpenExecutable(target)
		cl2, err := ex.UprobeMulti(names, c.CountEntry, nil); if err!=nil {t.Fatal(err)}
		t4:=time.Now()
		cl2.Close()
		t5:=time.Now()
		if i>=2 { r=append(r,t1.Sub(t0)); a=append(a,t2.Sub(t1)); cl=append(cl,t3.Sub(t2)); ca=append(ca,t4.Sub(t3)); cc=append(cc,t5.Sub(t4)); tot=append(tot, t2.Sub(t0)); ctot=append(ctot, t4.Sub(t3))}
	}
	fmt.Println("resolve",med(r),"attach",med(a),"r+a", med(tot), "close",med(cl),"| cilium attach",med(ca),"close",med(cc))
}
